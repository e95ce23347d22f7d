"""Low-level helpers every layer may use: redaction of secrets (redact), private files and atomic writes
(files), YAML with line numbers (yamlio), the bounded constraint-expression evaluator (expr), text
formatting (textfmt), subprocess helpers (proc) and the one logging set-up (logs).

May import: tuner.errors only (and each other: redact at the bottom).
"""
