"""Calls swapped between ranks never pair silently (issue 33): a `name=` enters the ranks'
agreement in every mode, and the detail debug mode adds the call site of every public
collective. Run by tests/test_one_rank_args.py at 2 and 3 ranks."""

import torch
from harness import fm, raises, run_cases

from fluxmpi_py.runtime.agreement import set_debug_mode


def in_step():
    t = torch.ones(2)
    fm.allreduce_(t)
    assert torch.equal(t, torch.full((2,), float(fm.total_workers()))), t


def case_named_calls_in_the_same_order_pair():
    a, b = torch.ones(3), torch.full((3,), 2.0)
    fm.allreduce_(a, name="a")
    fm.allreduce_(b, name="b")
    n = fm.total_workers()
    assert torch.equal(a, torch.full((3,), float(n))) and torch.equal(b, torch.full((3,), 2.0 * n))
    # the other collectives take name= too, and a group with it
    assert fm.allgather(torch.ones(1), name="rows").shape == (n,)
    assert fm.broadcast_object({"k": 1}, name="obj") == {"k": 1}


def case_swapped_named_calls_raise_on_every_rank_naming_both():
    a, b = torch.ones(3), torch.ones(3)  # the same shape: by position they would pair
    first, second = ("a", "b") if fm.local_rank() == 0 else ("b", "a")
    msg = raises(RuntimeError, lambda: fm.allreduce_(a, name=first), "ranks are in different calls")
    assert "allreduce_(name='a')" in msg and "allreduce_(name='b')" in msg, msg
    assert torch.equal(a, torch.ones(3)), a  # no data moved
    raises(RuntimeError, lambda: fm.allreduce_(b, name=second), "ranks are in different calls")
    in_step()


def case_a_name_on_one_rank_only_raises_on_every_rank():
    t = torch.ones(2)
    name = "w" if fm.local_rank() == fm.total_workers() - 1 else None
    msg = raises(RuntimeError, lambda: fm.allreduce_(t, name=name), "ranks are in different calls")
    assert "allreduce_(name='w')" in msg and "allreduce_()" in msg, msg
    in_step()


def case_detail_mode_names_both_call_sites():
    assert set_debug_mode("detail") is None
    try:
        t = torch.ones(4)
        if fm.local_rank() == 0:
            msg = raises(RuntimeError, lambda: fm.bcast_(t, 0), "ranks are in different calls")
        else:
            msg = raises(RuntimeError, lambda: fm.bcast_(t, 0), "ranks are in different calls")
        assert msg.count("swapped_calls_worker.py:") >= 2, msg
        # the same site on every rank pairs
        fm.allreduce_(t)
        assert torch.equal(t, torch.full((4,), float(fm.total_workers()))), t
    finally:
        set_debug_mode("off")
    in_step()


def case_horovod_names_enter_the_agreement():
    import fluxmpi_py.horovod as hvd

    hvd.init()
    a = torch.ones(3)
    first, second = ("x", "y") if fm.local_rank() == 0 else ("y", "x")
    msg = raises(Exception, lambda: hvd.allreduce(a, name=first), "ranks are in different calls")
    assert "name='x'" in msg and "name='y'" in msg, msg
    raises(Exception, lambda: hvd.allreduce(a, name=second), "ranks are in different calls")
    h = hvd.allreduce_async(a, name="z", op=hvd.Sum)  # the same name everywhere pairs
    assert torch.equal(hvd.synchronize(h), torch.full((3,), float(fm.total_workers())))
    in_step()


def case_detail_mode_names_the_users_line_through_horovod():
    import fluxmpi_py.horovod as hvd

    assert set_debug_mode("detail") is None
    try:
        t = torch.ones(2)
        if fm.local_rank() == 0:
            msg = raises(Exception, lambda: hvd.allreduce(t), "ranks are in different calls")
        else:
            msg = raises(Exception, lambda: hvd.allreduce(t), "ranks are in different calls")
        assert msg.count("swapped_calls_worker.py:") >= 2, msg
    finally:
        set_debug_mode("off")
    in_step()


def case_unknown_debug_mode_is_named():
    err = set_debug_mode("loud")
    assert isinstance(err, ValueError) and "Init(debug='loud')" in str(err), err
    assert "'off' or 'detail'" in str(err), err


if __name__ == "__main__":
    run_cases(globals())
