"""The champion stores: the champion file, its history, the audit log and pending candidates (store), and
the same in a shared database for a fleet (db).

May import: tuner.study, tuner.coord and below.
"""
