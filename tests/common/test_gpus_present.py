"""The GPUs of the KFD topology (a fake sysfs tree): arch names, and what
`info` and `smoke` print for each, with the install commands of the one whose
kernel image is missing."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from aotriton_rocm.commands import cli, smoke
from aotriton_rocm.core import device
from aotriton_rocm.common import gpus_present, images
from support import real_archives as RA


def _node(root: Path, n: int, target_version: int, **files: str) -> None:
    d = root / gpus_present.TOPOLOGY / str(n)
    d.mkdir(parents=True)
    # the first keys of a real gfx942 node's properties, trimmed
    (d / "properties").write_text(f"cpu_cores_count {0 if target_version else 64}\n"
                                  f"simd_count {0 if target_version else 0}\n"
                                  f"gfx_target_version {target_version}\nvendor_id 4098\n")
    for name, text in files.items():
        (d / name).write_text(text + "\n")


@pytest.fixture
def sysfs(tmp_path, monkeypatch):
    """A CPU node, two MI300X (gfx942) and a Strix Halo (gfx1151)."""
    root = tmp_path / "sys"
    _node(root, 0, 0)
    _node(root, 1, 90402, name="gfx942")
    _node(root, 2, 90402, name="gfx942")
    _node(root, 10, 110501, marketing_name="AMD Radeon 8060S")
    monkeypatch.setenv(gpus_present.SYSFS_ENV, str(root))
    return root


@pytest.fixture
def one_image(isolated_images):
    """gfx942's image is installed (AOTRITON_ROCM_ARCHIVE_DIR), nothing else."""
    RA.write(isolated_images, "gfx942")
    images.clear_cache()
    return isolated_images


def test_target_versions_name_the_arch():
    for value, arch in ((90402, "gfx942"), (90010, "gfx90a"), (90008, "gfx908"), (90500, "gfx950"),
                        (100300, "gfx1030"), (110001, "gfx1101"), (110501, "gfx1151"),
                        (120001, "gfx1201"), (120500, "gfx1250")):
        assert gpus_present.arch_of_target_version(value) == arch, value
    assert gpus_present.arch_of_target_version(0) is None  # a CPU node


def test_nodes_in_order_cpus_left_out(sysfs):
    assert gpus_present.gpus_present() == [gpus_present.Gpu(1, "gfx942", "gfx942"),
                                           gpus_present.Gpu(2, "gfx942", "gfx942"),
                                           gpus_present.Gpu(10, "gfx1151", "AMD Radeon 8060S")]
    assert gpus_present.gpus_present(str(sysfs.parent / "nowhere")) == []


def test_install_commands_keep_the_version_and_rocm():
    assert gpus_present.install_commands("gfx1151", "0.1.0+rocm10.0") == [
        'pip install "aotriton-rocm[gfx1151]==0.1.0+rocm10.0"',
        'conda install -c CHANNEL "aotriton-rocm-gfx1151=0.1.0=rocm100_*"']
    assert gpus_present.install_commands("gfx950", "0.1.0") == [
        'pip install "aotriton-rocm[gfx950]==0.1.0"', 'conda install -c CHANNEL "aotriton-rocm-gfx950=0.1.0"']


def _version() -> str:
    return importlib.metadata.version("aotriton-rocm")


def test_info_lists_the_gpus_and_installs_the_missing_image(sysfs, one_image, capsys):
    rc = cli.main(["info"])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    i = lines.index("GPUs in the KFD topology:")
    assert lines[i + 1] == "  gfx942 x2 (gfx942), node 1, 2: kernel image installed"
    assert lines[i + 2] == "  gfx1151 x1 (AMD Radeon 8060S), node 10: NO kernel image installed"
    assert lines[i + 3] == f'      install: pip install "aotriton-rocm[gfx1151]=={_version()}"'
    assert lines[i + 4].startswith('      install: conda install -c CHANNEL "aotriton-rocm-gfx1151=')


def test_smoke_lists_them_too(sysfs, one_image, capsys, monkeypatch):
    monkeypatch.setattr(smoke, "cpu_cases", lambda quick=False: [])  # no attention case
    monkeypatch.setattr(device, "gpu_available", lambda: False)
    assert cli.main(["smoke", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "  gfx1151 x1 (AMD Radeon 8060S), node 10: NO kernel image installed" in out
    assert f'install: pip install "aotriton-rocm[gfx1151]=={_version()}"' in out


def test_an_arch_without_images_is_named(sysfs, monkeypatch):
    _node(sysfs, 11, 100300)  # an RX 6800 (gfx1030): we build no image for RDNA2
    monkeypatch.setattr(images, "published_image_extras", lambda: ["gfx942", "gfx1151"])
    lines = gpus_present.report_lines(["gfx942", "gfx1151"])
    assert lines[-2:] == ["  gfx1030 x1, node 11: NO kernel image installed",
                          "      aotriton-rocm publishes no kernel image for gfx1030 (images: gfx942, "
                          "gfx1151); torch's own attention kernels run there"]


def test_no_driver(tmp_path, monkeypatch):
    monkeypatch.setenv(gpus_present.SYSFS_ENV, str(tmp_path))
    assert gpus_present.report_lines(["gfx942"]) == [
        "GPUs in the KFD topology: none (no amdgpu driver, or no AMD GPU)"]
