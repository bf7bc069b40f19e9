// Orders work between two streams of one device without blocking the host: an event recorded
// on one thread's current stream, which another thread's current stream then waits on. The
// gradient reducer uses it twice per bucket on a GPU: the engine's stream waits for backward's
// (the gradients and their pack) before the collective, and step()'s stream waits for the
// engine's (the collective and its unpack) before the optimizer reads the gradients.
// Device-generic (c10::Event): CUDA here; host tensors need no ordering, so none is made.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <memory>

namespace fluxmpi {

class StreamMark {
 public:
  explicit StreamMark(c10::Device device);
  // Records the event on this thread's current stream of the device.
  void record_on_current_stream();
  // This thread's current stream of the device waits for the last record (the host does not).
  void make_current_stream_wait() const;

 private:
  c10::Device device_;
  c10::Event event_;
};

// A mark for `device`, or null for a device without streams (the CPU).
std::shared_ptr<StreamMark> stream_mark_for(c10::Device device);

}  // namespace fluxmpi
