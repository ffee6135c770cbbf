"""Messages that name the real problem and a next step that works: --help
in plain text, an unknown arch named as unknown (not echoed back in an
install or build command), a file where a parent directory should be, the
archives directory of a build (OUT/archives/, not OUT), and no option a
command does not have. In process, on small real files."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from aotriton_rocm.commands import cli

ROOT = Path(__file__).resolve().parents[2]


def test_every_help_is_plain_text():
    assert cli.plain_text("``a`` :func:`~x.y.name` :class:`Path` b::\n") == "a name Path b:\n"
    texts = {}
    for name in [None, *cli.COMMANDS]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
            cli.main([name, "--help"] if name else ["--help"])
        texts[name] = buf.getvalue()
    bad = {n: re.findall(r"``|:[a-z]+:`", t) for n, t in texts.items()}
    assert all(not b for b in bad.values()), bad
    assert "aotriton-rocm abi-check OLD NEW: compare" in " ".join(texts["abi-check"].split())


def test_a_file_as_a_parent_is_named(tmp_path):
    from aotriton_rocm.common.files import parent_file_problem
    from aotriton_rocm.tooling.builder.command import OutDirError, check_out_dir
    from aotriton_rocm.tooling.package.dist_dir import check_out

    f = tmp_path / "file"
    f.write_text("x")
    want = f"{f} is a file, not a directory, so nothing can be written under it"
    assert want in parent_file_problem(f / "a" / "b")
    assert parent_file_problem(tmp_path / "new" / "dir") is None
    with pytest.raises(OutDirError, match=want):
        check_out_dir(f / "sub")
    why = check_out(f / "sub")
    assert want in why and "permission denied" not in why
    assert f.read_text() == "x"


def test_package_names_an_unknown_arch_with_the_known_ones():
    from aotriton_rocm.common.errors import UsageError
    from aotriton_rocm.tooling.package.command import _check_known_archs

    with pytest.raises(UsageError) as e:
        _check_known_archs(("gfx942", "gfx9422"), ROOT)
    msg = str(e.value)
    assert msg.startswith("unknown arch gfx9422: the archs of") and "gfx942, " in msg
    assert "build --arch gfx9422" not in msg
    _check_known_archs(("gfx942", "sm_90"), ROOT)


def test_pin_names_an_unknown_arch():
    from aotriton_rocm.common import images
    from aotriton_rocm.tooling.release import pin

    published = images.published_image_extras()
    if published is None:
        pytest.skip("the runtime has no distribution metadata here")
    with pytest.raises(pin.PinError) as e:
        pin.pin_lines("2.13", ["gfx9422"])
    assert str(e.value) == (f"unknown arch gfx9422: aotriton-rocm publishes kernel images for "
                            f"{', '.join(published)}")
    assert pin.pin_lines("2.13", ["gfx942", "sm_90"])["pip"][0].startswith("aotriton-rocm[gfx942,sm90]")


def test_package_points_at_the_archives_directory_of_a_build(tmp_path):
    from aotriton_rocm.tooling.package.archive_intake import (ArchiveInput, PackagingError,
                                                              check_complete, collect_archives)

    out = tmp_path / "build"
    (out / "archives").mkdir(parents=True)
    (out / "archives" / "gfx942.aotr").write_bytes(b"x")
    with pytest.raises(PackagingError) as e:   # build's --out passed as --archives
        collect_archives(out, None, "0.1.0")
    assert f"{out / 'archives'} holds some" in str(e.value)
    assert f"pass --archives {out / 'archives'}" in str(e.value)
    with pytest.raises(PackagingError) as e:
        collect_archives(out / "archives", ["gfx90a"], "0.1.0")
    assert str(e.value).endswith(f"build it: aotriton-rocm build --arch gfx90a --out {out}")
    with pytest.raises(PackagingError) as e:   # a directory build never writes into
        collect_archives(tmp_path, ["gfx90a"], "0.1.0")
    assert "--out OUT, then package OUT/archives" in str(e.value)
    assert f"--out {tmp_path}" not in str(e.value)
    subset = [ArchiveInput("gfx942", out / "archives" / "gfx942.aotr",
                           out / "archives" / "gfx942.manifest.json", {"subset": "dtype=fp16"})]
    for offer in (True, False):
        with pytest.raises(PackagingError) as e:
            check_complete(subset, offer_allow_subset=offer)
        assert ("--allow-subset" in str(e.value)) is offer
        assert f"aotriton-rocm build --arch gfx942 --out {out}" in str(e.value)


def test_validate_and_report_name_the_right_directory(tmp_path):
    from aotriton_rocm.common.errors import UsageError
    from aotriton_rocm.tooling.builder.static_report import ReportOptions, run_report
    from aotriton_rocm.tooling.builder.validate_archives import ValidateOptions, run_validate

    out = tmp_path / "build"
    (out / "archives").mkdir(parents=True)
    (out / "archives" / "gfx942.aotr").write_bytes(b"x")
    (out / "build-report.json").write_text("{}")
    for given in (out, out / "archives"):
        with pytest.raises(UsageError) as e:
            run_validate(ValidateOptions(archives=(str(given),)))
        assert str(e.value) == (f"{given} is a directory: validate takes archive files; pass "
                                f"{out / 'archives' / '*.aotr'}")
    with pytest.raises(UsageError) as e:
        run_report(ReportOptions(build_dir=out / "archives"))
    assert f"pass {out}, the --out of the build" in str(e.value)


def test_a_damaged_archive_of_an_unknown_arch_is_not_sent_to_pip_or_build(tmp_path):
    from aotriton_rocm.common import images
    from aotriton_rocm.common.archive import Archive, ArchiveError, identity_fix

    published = images.published_image_extras()
    if published is None:
        pytest.skip("this runtime has no package metadata to name its archs")
    (tmp_path / "gfx9422.aotr").write_bytes(b"not an archive")
    with pytest.raises(ArchiveError) as e:
        Archive.open(tmp_path / "gfx9422.aotr")
    assert "'gfx9422' is no arch aotriton-rocm publishes kernel images for" in str(e.value)
    assert "aotriton-rocm-gfx9422" not in str(e.value) and "--arch gfx9422" not in str(e.value)
    (tmp_path / "gfx942.aotr").write_bytes(b"not an archive")
    with pytest.raises(ArchiveError) as e:
        Archive.open(tmp_path / "gfx942.aotr")
    assert "pip install --force-reinstall --no-deps 'aotriton-rocm-gfx942~=" in str(e.value)
    # a build's rebuild hint names the --out that build writes the archive directory under
    out = tmp_path / "out"
    assert identity_fix("gfx942", "build", out / "archives" / "gfx942.aotr").endswith(
        f"aotriton-rocm build --arch gfx942 --out {out}")
    elsewhere = identity_fix("gfx942", "build", tmp_path / "gfx942.aotr")
    assert f"--out {tmp_path}" not in elsewhere and "then package OUT/archives" in elsewhere
