"""tuner report: a self-contained HTML report and a Markdown summary of an agent's study."""
