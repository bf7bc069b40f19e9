"""The stream ordering of a collective on a communication stream (csrc/runtime/comm_stream_order.h),
on a fake asynchronous device (csrc/runtime/fake_streams.h): each stream a worker thread, each
event a count of a stream's finished work. The producer's write is held back until the other
streams have gone as far as they can, so a missing wait reads a wrong value, every time."""

from __future__ import annotations

from fluxmpi_py._core import C


def test_ordered_collective_reads_the_write_and_the_consumer_its_result():
    # the producer writes 7, the collective doubles it, the consumer reads the result
    for _ in range(20):
        assert C.stream_order_probe(True, True) == 14


def test_a_missing_wait_reads_a_wrong_value():
    # without the communication stream's wait for the producer: the value before the write
    assert C.stream_order_probe(False, True) == 0
    # without the consumer's wait for the completion event: the result before it was written
    assert C.stream_order_probe(True, False) == -1
    assert C.stream_order_probe(False, False) in (0, -1)
