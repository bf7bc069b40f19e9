// How a collective on a communication stream of its own is ordered against the streams that
// produce and consume its data, written once over a Device so that the same code runs on CUDA
// (csrc/cuda/nccl_backend_cuda.cpp) and on a fake asynchronous device in the CPU tests
// (runtime/fake_streams.h), where a missing wait reads wrong values.
//
// A Device provides
//   Stream                               copyable, comparable with ==
//   Event  record(const Stream& s)       completes once s has run all it has queued so far
//   void   wait(const Stream& s, const Event& e)
//                                        s runs nothing queued after this before e completes
// Neither blocks the host. The order, as torch's ProcessGroupNCCL keeps it:
//   1. enter:   the communication stream waits for an event of the producer's stream (the
//               stream current when the data became ready), so the collective never reads
//               before the producer's write;
//   2. the collective is queued on the communication stream;
//   3. leave:   its completion is an event recorded on the communication stream after it;
//      consume: a consumer stream waits for that event (on the device, not the host) before it
//               reads the result.
#pragma once

#include <utility>

namespace fluxmpi {

// A negative control for the GPU checks only (scripts/gpu_ranks_check.py --no-stream-waits, the
// nowait-control step of scripts/gpu_check.sh): off, the NCCL backend's enter_stream and every
// StreamMark::make_current_stream_wait (ops/stream_order.h) leave their wait out, so that work on
// another stream is read before it is written, and the side-stream probe must see wrong values.
// On by default; nothing in the library turns it off. (The fake device's tests leave a wait out
// their own way: runtime/fake_streams.h.)
void set_stream_waits(bool on);
bool stream_waits();

template <class Device>
void enter_stream(Device& dev, const typename Device::Stream& producer,
                  const typename Device::Stream& comm) {
  if (producer == comm) return;  // one stream orders itself
  dev.wait(comm, dev.record(producer));
}

template <class Device>
typename Device::Event leave_stream(Device& dev, const typename Device::Stream& comm) {
  return dev.record(comm);
}

template <class Device>
void consume_after(Device& dev, const typename Device::Stream& consumer,
                   const typename Device::Event& done) {
  dev.wait(consumer, done);
}

// 1 to 3 around `issue(comm)`, which queues the collective on `comm`; returns the completion
// event for consume_after.
template <class Device, class Issue>
typename Device::Event run_ordered(Device& dev, const typename Device::Stream& producer,
                                   const typename Device::Stream& comm, Issue&& issue) {
  enter_stream(dev, producer, comm);
  std::forward<Issue>(issue)(comm);
  return leave_stream(dev, comm);
}

}  // namespace fluxmpi
