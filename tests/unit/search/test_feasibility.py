"""The failure classifier (issue 26): fitted on labelled configurations, it flags the region that failed."""

from tuner.search.feasibility import FailureModel
from tuner.search.space import parse_space

SPACE = parse_space({"params": {"chunked": {"type": "bool", "default": True},
                                "tokens": {"type": "int", "low": 256, "high": 32768, "log": True, "default": 2048},
                                "seqs": {"type": "int", "low": 8, "high": 1024, "log": True, "default": 256}}},
                    file="<test>")


def test_it_learns_the_region_that_fails_and_stays_silent_without_both_labels() -> None:
    model = FailureModel(SPACE, threshold=0.8, min_trials=6)
    configs, failed = [], []
    for tokens in (256, 512, 1024, 2048, 8192, 16384, 32768):
        for chunked in (False, True):
            for seqs in (16, 256):
                configs.append({"chunked": chunked, "tokens": tokens, "seqs": seqs})
                failed.append(not chunked and tokens < 8192)  # the engine refuses these
    model.fit(configs[:5], [False] * 5)
    assert model.p_fail(configs[0]) is None  # too few trials, and one label only
    model.fit(configs, failed)
    assert model.rejects({"chunked": False, "tokens": 700, "seqs": 64}) is not None
    assert model.rejects({"chunked": True, "tokens": 700, "seqs": 64}) is None
    assert model.rejects({"chunked": False, "tokens": 30000, "seqs": 64}) is None
