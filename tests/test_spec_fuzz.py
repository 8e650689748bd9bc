"""Thousands of generated job documents and overrides: each is accepted or refused with a
UsageError that names what was wrong; nothing else escapes the loader."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stampede.errors import UsageError
from stampede.spec import OPTIONS, JobSpec, build_job

KEYS = [option.key for option in OPTIONS]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["4MiB", "1GiB", "0", "shared", "sharded", "broadcast",
                                     "cold", "warm", "direct", "sha256", "uniform:0.1",
                                     "exponential:-1", "stat", "read", "open", "close"]))
values = st.one_of(scalars, st.lists(scalars, max_size=4),
                   st.dictionaries(st.text(max_size=5), scalars, max_size=2))
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=20))


@st.composite
def documents(draw: st.DrawFn) -> dict[str, object]:
    document: dict[str, object] = {"target": {"path": "/tmp/x"}, "checkpoint": {"size": "1GiB"}}
    for key, value in draw(st.lists(st.tuples(keys, values), max_size=6)):
        section, _, name = key.partition(".")
        if name:
            table = document.setdefault(section, {})
            if isinstance(table, dict):
                table[name] = value
        else:
            document[section] = value
    return document


overrides = st.lists(st.one_of(
    st.builds(lambda key, text: f"{key}={text}", st.sampled_from(KEYS), st.text(max_size=15)),
    st.text(max_size=25)), max_size=3)


@settings(max_examples=2000, deadline=None)
@given(documents(), overrides)
def test_every_job_is_accepted_or_refused_clearly(document: dict[str, object],
                                                  sets: list[str]) -> None:
    try:
        spec = build_job("fuzz", "fuzz.toml", document, sets)
    except UsageError as error:
        text = str(error)
        assert text and ("fuzz.toml" in text or "--set" in text), text
        assert "Traceback" not in text
        return
    assert isinstance(spec, JobSpec)
    assert spec.block_bytes > 0 and spec.iterations >= 1 and spec.layouts
