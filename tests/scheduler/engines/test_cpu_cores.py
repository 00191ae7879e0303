"""Which cores each CPU engine of a node binds its model to (pure: no engine, no database)."""

import pytest

from scheduler.engines.cpu_cores import engine_cores, omp_threads_bind


def test_a_lone_engine_keeps_vllms_own_binding() -> None:
    assert engine_cores([0, 1], engines=1, position=0) == ()
    assert engine_cores(range(16), engines=1, position=0) == ()


def test_two_engines_on_two_cpus_get_one_each() -> None:
    assert engine_cores([0, 1], engines=2, position=0) == (0,)
    assert engine_cores([0, 1], engines=2, position=1) == (1,)


def test_engines_share_the_cpus_less_one_without_overlap() -> None:
    shares = [engine_cores(range(16), engines=2, position=i) for i in range(2)]
    assert shares == [tuple(range(0, 7)), tuple(range(7, 14))]  # 14 and 15 stay free
    thirds = [set(engine_cores(range(16), engines=3, position=i)) for i in range(3)]
    assert [len(share) for share in thirds] == [5, 5, 5]
    assert len(thirds[0] | thirds[1] | thirds[2]) == 15  # no two share a CPU


def test_the_cpus_are_those_allowed_in_their_order() -> None:
    assert engine_cores([6, 2, 4, 8], engines=3, position=2) == (6,)
    assert engine_cores([6, 2, 4, 8], engines=3, position=0) == (2,)


def test_more_engines_than_cpus_wrap_around() -> None:
    assert [engine_cores([0, 1], engines=3, position=i) for i in range(3)] == [(0,), (1,), (0,)]


@pytest.mark.parametrize(("engines", "position"), [(0, 0), (2, 2), (2, -1)])
def test_a_position_outside_the_engines_is_refused(engines: int, position: int) -> None:
    with pytest.raises(ValueError, match="engine"):
        engine_cores([0, 1], engines=engines, position=position)


@pytest.mark.parametrize(
    ("cores", "bind"),
    [([0], "0"), ([3, 1, 2], "1-3"), ([0, 1, 2, 3, 8], "0-3,8"), ([5, 9, 7], "5,7,9")],
)
def test_the_binding_is_written_as_vllm_reads_it(cores: list[int], bind: str) -> None:
    assert omp_threads_bind(cores) == bind


def test_no_cores_is_no_binding() -> None:
    with pytest.raises(ValueError, match="no cores"):
        omp_threads_bind([])
