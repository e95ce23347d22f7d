"""tuner: an auto-tuning agent for LLM serving stacks."""

__version__ = "0.1.0"
