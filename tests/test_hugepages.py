"""Weights on 2 MiB pages (``backends.hugepages``, ``huge_page_bytes`` in ``native/projection.h``): the copies hold
the same bytes, and the memory under them is advised to the kernel as huge pages (``hg`` in the mapping's
VmFlags), whatever the kernel then gives."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paradecode.backends import hugepages

linux_only = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")


def mappings() -> list[dict]:
    """This process's mappings from /proc/self/smaps: each one's ``low`` and ``high`` address and its fields
    (``VmFlags`` as a set)."""
    found = []
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            low, high = (int(x, 16) for x in head.split("-"))
            found.append({"low": low, "high": high})
        elif found:
            key, _, value = line.partition(":")
            found[-1][key] = set(value.split()) if key == "VmFlags" else value.strip()
    return found


def mapping_of(address: int) -> dict:
    """The mapping holding ``address``."""
    return next(m for m in mappings() if m["low"] <= address < m["high"])


def advised_sizes() -> list[int]:
    """The sizes of the mappings advised as huge pages (``hg``)."""
    return [m["high"] - m["low"] for m in mappings() if "hg" in m.get("VmFlags", ())]


@linux_only
def test_copies_are_the_same_tensors_in_one_advised_mapping():
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randint(0, 256, (600_001 + i,), dtype=torch.uint8, generator=generator) for i in range(6)]
    tensors += [torch.randn(3, 1000, generator=generator), torch.randint(-127, 128, (77, 5), dtype=torch.int8)]
    copies = hugepages.together(tensors)
    for tensor, copy in zip(tensors, copies):
        assert copy.dtype == tensor.dtype and copy.shape == tensor.shape and torch.equal(copy, tensor)
        assert copy.data_ptr() % hugepages.ALIGN == 0
    assert copies[0].data_ptr() % hugepages.HUGE_PAGE == 0
    assert len({mapping_of(c.data_ptr())["low"] for c in copies}) == 1  # one mapping
    assert "hg" in mapping_of(copies[0].data_ptr())["VmFlags"]
    small = [torch.zeros(10)]
    assert hugepages.together(small)[0] is small[0]  # under a huge page: left as it is


@linux_only
def test_the_native_forward_packs_its_int8_weights_on_advised_mappings():
    """In a fresh process (the packing's mappings are shared by every model of a process), a tiny int8 model's
    native weights create a 32 MiB mapping advised as huge pages (its outputs are the other tests')."""
    script = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_hugepages import advised_sizes
before = advised_sizes()
from tiny import tiny_int8_backend
backend = tiny_int8_backend()
assert backend._native is not None, "no native forward"
print(json.dumps([before, advised_sizes()]))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    if "no native forward" in run.stderr:
        pytest.skip("the native forward is not built here")
    assert run.returncode == 0, run.stderr[-2000:]
    before, after = json.loads(run.stdout.strip().splitlines()[-1])
    assert (32 << 20) not in before and (32 << 20) in after
