"""Review: redaction hides secrets, not the serving knobs that merely count tokens."""

from __future__ import annotations

from tuner.tracking import redact


def test_token_count_knobs_are_not_redacted() -> None:
    knobs = {"max_num_batched_tokens": 2048, "prefill_chunk_tokens": 512, "long_prefill_token_threshold": 0,
             "tokenizer": "byte", "target.tokenizer": "byte"}
    assert redact(knobs) == knobs


def test_secrets_are_redacted() -> None:
    secrets = {"api_key": "sk-1", "hf_token": "hf_x", "HF_TOKEN": "hf_y", "password": "p", "db_passwd": "p",
               "client_secret": "s", "auth": "a", "Authorization": "Bearer x", "openai-api-key": "k",
               "token": "t", "secret_access_key": "k"}
    assert set(redact(secrets).values()) == {"***"}
