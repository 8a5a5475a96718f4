"""``value_class``: frozen to the type checker, a plain slotted dataclass to build."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
from mypy import api as mypy_api

from controller.core.health import GpuHealth, HealthReport
from controller.policies.samples import GpuReading

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def test_values_compare_and_hash_by_their_fields_and_copy_like_dataclasses() -> None:
    a = HealthReport(sampled_at=1.0, gpus=(GpuHealth(index=0, temp_c=41.0, xids=(79,)),))
    b = HealthReport(sampled_at=1.0, gpus=(GpuHealth(index=0, temp_c=41.0, xids=(79,)),))
    assert a == b and a is not b
    assert hash(a) == hash(b) and len({a, b}) == 1
    c = dataclasses.replace(a, sampled_at=2.0)
    assert c != a and a.sampled_at == 1.0
    assert pickle.loads(pickle.dumps(c)) == c
    assert [f.name for f in dataclasses.fields(GpuReading)][:2] == ["index", "temp_c"]
    with pytest.raises(AttributeError):
        GpuHealth(index=0).not_a_field = 1  # type: ignore[attr-defined]  # slotted


def test_the_type_checker_refuses_to_change_a_field(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from controller.core.health import GpuHealth\ng = GpuHealth(index=0)\ng.temp_c = 99.0\n"
    )
    out, _, status = mypy_api.run(
        [str(probe), "--no-incremental", "--follow-imports=silent", "--config-file", ""]
    )
    assert status == 1, out
    assert 'Property "temp_c" defined in "GpuHealth" is read-only' in out
