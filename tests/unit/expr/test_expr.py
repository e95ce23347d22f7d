import pytest

from tuner.base.expr import Expr, ExprError


@pytest.mark.parametrize(
    ("src", "env", "expected"),
    [
        ("a >= b", {"a": 4, "b": 3}, True),
        ("a >= b", {"a": 2, "b": 3}, False),
        ("1 <= a < 10", {"a": 10}, False),
        ("mode in ['x', 'y']", {"mode": "y"}, True),
        ("mode not in ('x', 'y')", {"mode": "y"}, False),
        ("not eager and size > 0", {"eager": False, "size": 3}, True),
        ("tp * dp <= 8", {"tp": 4, "dp": 4}, False),
        ("max(a, b) // 2 == 5", {"a": 10, "b": 3}, True),
        ("x if flag else y", {"flag": False, "x": 1, "y": 2}, 2),
        ("device == 'cuda'", {"device": "cpu"}, False),
        ("a > 3", {"a": None}, False),  # inactive parameters read as None: comparisons are false
        ("a is None or a > 3", {"a": None}, True),
        ("-a + 2 ** 3 % 5", {"a": 1}, 2),
        ("flag == true", {"flag": True}, True),
    ],
)
def test_evaluates(src: str, env: dict, expected: object) -> None:
    assert Expr(src)(env) == expected


def test_names_collected() -> None:
    assert Expr("max_num_batched_tokens >= max_num_seqs and min(a, 3) > 0").names == {
        "max_num_batched_tokens", "max_num_seqs", "a"}


@pytest.mark.parametrize(
    "src",
    [
        "__import__('os').system('true')",
        "a.__class__",
        "open('/etc/passwd')",
        "[x for x in range(3)]",
        "lambda: 1",
        "a[0]",
        "f'{a}'",
        "a = 1",
        "a >",
    ],
)
def test_rejects_unsafe_or_invalid(src: str) -> None:
    with pytest.raises(ExprError):
        Expr(src)


def test_unknown_name_at_evaluation() -> None:
    with pytest.raises(ExprError, match="unknown name 'zz'"):
        Expr("zz > 1")({})
