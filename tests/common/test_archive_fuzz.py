"""The Python archive reader against mutated archives: random byte flips,
overwrites, truncations and insertions of a real archive (written by the
real writer). Every mutation that changes the file is detected, and nothing
but ArchiveError (or a listed problem) ever comes out: no other exception,
no hang. Hypothesis, derandomized; the C reader has the same fuzz in
tests/native_library/test_archive_reader.py."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from support import real_archives as RA  # noqa: E402
from aotriton_rocm.common import archive as A  # noqa: E402
from aotriton_rocm.common import archive_identity as AI  # noqa: E402

MUTATIONS = st.lists(st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(1, 255)),
    st.tuples(st.just("overwrite"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20), st.just(b"")),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=16)),
), min_size=1, max_size=4)


def _mutate(data: bytes, mutations) -> bytes:
    b = bytearray(data)
    for op, pos, arg in mutations:
        pos %= max(1, len(b))
        if op == "flip" and b:
            b[pos] ^= arg
        elif op == "overwrite":
            b[pos:pos + len(arg)] = arg
        elif op == "truncate":
            del b[pos:]
        elif op == "insert":
            b[pos:pos] = arg
    return bytes(b)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    path = RA.write(d, "gfx942", kernels=3, size=4096)
    return path, path.read_bytes()


@settings(max_examples=300, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=MUTATIONS)
def test_mutated_archives_give_named_errors_only(original, mutations):
    path, data = original
    mutated = _mutate(data, mutations)
    path.write_bytes(mutated)
    try:
        problems = []
        try:
            a = A.Archive.open(path)
            problems += a.verify()
            for r in a.kernels:
                try:
                    a.code_object(r)
                except A.ArchiveError as e:
                    problems.append(str(e))
        except A.ArchiveError as e:
            problems.append(str(e))
        problems += AI.verify_against_manifest(path)  # the sidecar knows the file's sha256
        if mutated != data:
            assert problems, "a changed archive passed every check"
        else:
            assert not problems, problems
    finally:
        path.write_bytes(data)
