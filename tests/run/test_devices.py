"""The devices' labels: what cuFile did is said (GDS, or NOT GDS), and GPUDirect Storage
without kvikio is one clear refusal. kvikio's reported state is given as kvikio reports it
(the objects its modules expose), since a machine with nvidia-fs loaded is not at hand."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from stampede.errors import UsageError
from stampede.run.devices import NOT_GDS, Gds, gds_state


def kvikio_reporting(compat: bool) -> SimpleNamespace:
    """What kvikio >= 24.10 exposes first: defaults.is_compat_mode_preferred() (its driver
    state is asked of the module kvikio.cufile_driver, imported by name)."""
    return SimpleNamespace(defaults=SimpleNamespace(is_compat_mode_preferred=lambda: compat))


def test_compatibility_mode_is_labelled_not_gds() -> None:
    is_gds, label = gds_state(kvikio_reporting(True))
    assert not is_gds and NOT_GDS in label and "compatibility mode" in label


def test_without_the_driver_module_gds_is_never_assumed() -> None:
    # compat off, but kvikio.cufile_driver cannot be imported here (kvikio absent): the
    # nvidia-fs state is unknown, so the label says NOT GDS rather than guess
    if importlib.util.find_spec("kvikio") is not None:
        pytest.skip("kvikio is installed: its real cufile_driver would answer")
    is_gds, label = gds_state(kvikio_reporting(False))
    assert not is_gds and NOT_GDS in label and "not reported" in label


def test_gds_without_kvikio_is_one_clear_refusal() -> None:
    if importlib.util.find_spec("kvikio") is not None:
        pytest.skip("kvikio is installed here")
    with pytest.raises(UsageError) as refused:
        Gds()
    assert "needs kvikio, which is not installed" in refused.value.message
    assert "[gds]" in refused.value.hint
