"""MLflow: the tracker every process writes through (tracker; the only module that imports mlflow), its
local store (store), the plots (plots), what a reviewer sees (review) and reconciliation with Optuna, the
source of truth (sync).

May import: tuner.study and below; never the loop, promotion or the CLI.
"""
