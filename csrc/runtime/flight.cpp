#include "runtime/flight.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>

#include <fcntl.h>
#include <unistd.h>

namespace fluxmpi {
namespace {

constexpr int kDefaultSlots = 256;
constexpr std::size_t kMaxText = 400;  // of a call name or an abort's reason, in a dump

// One record. `seq` is stored last (release) and cleared first: a reader that sees the same
// seq before and after its copy read a whole record.
struct Slot {
  std::atomic<std::int64_t> seq{0};
  FlightRecord rec;
  std::atomic<std::int64_t> end_us{0};
};

struct Ring {
  explicit Ring(int n) : cap(n), slots(new Slot[static_cast<std::size_t>(n)]) {}
  int cap;
  std::unique_ptr<Slot[]> slots;
};

// Replaced rings are leaked on purpose: a writer on another thread may still hold one.
std::atomic<Ring*> g_ring{new Ring(kDefaultSlots)};
std::atomic<std::int64_t> g_next{0};

// The dump's target, built when set (never inside a signal handler).
std::mutex g_dir_mu;
std::string g_dir;
char g_path[4096] = "";
char g_tmp[4096] = "";
int g_rank = 0, g_size = 1;
std::atomic<int> g_dumping{0};      // a dump is being written
std::atomic<bool> g_dumped{false};  // one was written: the first event's stays

struct sigaction g_old_term, g_old_int;
bool g_handlers = false;

bool copy_record(const Slot& s, std::int64_t seq, FlightRecord* out) {
  if (s.seq.load(std::memory_order_acquire) != seq) return false;
  *out = s.rec;
  out->end_us = s.end_us.load(std::memory_order_acquire);
  std::atomic_thread_fence(std::memory_order_acquire);
  return s.seq.load(std::memory_order_relaxed) == seq;
}

// A buffered writer that allocates nothing and calls only write(2).
class Out {
 public:
  explicit Out(int fd) : fd_(fd) {}
  ~Out() { flush(); }
  void put(const char* s) {
    while (*s) byte(*s++);
  }
  void num(std::int64_t v) {
    char digits[24];
    int n = 0;
    const bool neg = v < 0;
    std::uint64_t u = neg ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
    do {
      digits[n++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (neg) byte('-');
    while (n > 0) byte(digits[--n]);
  }
  // A JSON string, at most kMaxText bytes of `s`.
  void str(const char* s) {
    byte('"');
    for (std::size_t i = 0; s != nullptr && s[i] != '\0' && i < kMaxText; ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c == '"' || c == '\\') {
        byte('\\');
        byte(static_cast<char>(c));
      } else if (c < 0x20) {
        static const char hex[] = "0123456789abcdef";
        put("\\u00");
        byte(hex[c >> 4]);
        byte(hex[c & 15]);
      } else {
        byte(static_cast<char>(c));
      }
    }
    byte('"');
  }
  // `, "key": value`
  void field(const char* key, std::int64_t v) {
    put_key(key);
    num(v);
  }
  void field(const char* key, const char* s) {
    put_key(key);
    str(s);
  }
  bool ok() const { return ok_; }
  void flush() {
    for (std::size_t done = 0; done < n_;) {
      ssize_t w = ::write(fd_, buf_ + done, n_ - done);
      if (w <= 0) {
        ok_ = false;
        break;
      }
      done += static_cast<std::size_t>(w);
    }
    n_ = 0;
  }

 private:
  void put_key(const char* key) {
    put(", \"");
    put(key);
    put("\": ");
  }
  void byte(char c) {
    if (n_ == sizeof buf_) flush();
    buf_[n_++] = c;
  }
  int fd_;
  char buf_[4096];
  std::size_t n_ = 0;
  bool ok_ = true;
};

void write_dump(Out& out, const char* reason, const char* why) {
  Ring* ring = g_ring.load(std::memory_order_acquire);
  const std::int64_t last = g_next.load(std::memory_order_acquire);
  out.put("{\"fluxmpi_flight\": 1");
  out.field("rank", g_rank);
  out.field("size", g_size);
  out.field("reason", reason);
  out.field("why", why);
  out.field("time_us", flight_now_us());
  out.field("capacity", ring->cap);
  out.field("recorded", last);
  out.put(",\n \"records\": [");
  bool first = true;
  const std::int64_t from = last - ring->cap + 1 > 1 ? last - ring->cap + 1 : 1;
  for (std::int64_t seq = from; seq <= last; ++seq) {
    FlightRecord r;
    if (!copy_record(ring->slots[static_cast<std::size_t>(seq % ring->cap)], seq, &r)) continue;
    out.put(first ? "\n  {\"seq\": " : ",\n  {\"seq\": ");
    first = false;
    out.num(r.seq);
    out.field("group", r.group);
    out.field("number", r.number);
    out.field("kind", r.kind);
    out.field("call", r.call);
    out.field("bytes", r.bytes);
    out.field("enter_us", r.enter_us);
    out.field("start_us", r.start_us);
    out.put(", \"end_us\": ");
    if (r.end_us == 0) {
      out.put("null");
    } else {
      out.num(r.end_us);
    }
    out.put("}");
  }
  out.put("\n]}\n");
}

const char* signal_name(int sig) { return sig == SIGTERM ? "SIGTERM" : "SIGINT"; }

void on_signal(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  flight_dump(signal_name(sig), "");
  errno = saved;
  struct sigaction& old = sig == SIGTERM ? g_old_term : g_old_int;
  if ((old.sa_flags & SA_SIGINFO) != 0) {
    if (old.sa_sigaction != nullptr) old.sa_sigaction(sig, info, context);
  } else if (old.sa_handler == SIG_DFL) {
    // The default action (the process ends): restored, and raised again on return.
    sigaction(sig, &old, nullptr);
    raise(sig);
  } else if (old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
  }
}

void install_handlers() {
  if (g_handlers) return;
  g_handlers = true;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
}

}  // namespace

std::int64_t flight_now_us() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

void set_flight_capacity(int slots) {
  g_ring.store(slots > 0 ? new Ring(slots) : nullptr, std::memory_order_release);
}

int flight_capacity() {
  Ring* r = g_ring.load(std::memory_order_acquire);
  return r != nullptr ? r->cap : 0;
}

void set_flight_dir(const std::string& dir, int rank, int size) {
  std::lock_guard<std::mutex> lk(g_dir_mu);
  g_dir = dir;
  g_rank = rank;
  g_size = size;
  g_path[0] = g_tmp[0] = '\0';
  if (dir.empty()) return;
  const std::string path = dir + "/fluxmpi_flight." + std::to_string(rank) + ".json";
  const std::string tmp = path + ".tmp";
  if (tmp.size() >= sizeof g_tmp) return;  // a directory past PATH_MAX: no dumps
  std::memcpy(g_path, path.c_str(), path.size() + 1);
  std::memcpy(g_tmp, tmp.c_str(), tmp.size() + 1);
  install_handlers();
}

std::string flight_dir() {
  std::lock_guard<std::mutex> lk(g_dir_mu);
  return g_dir;
}

std::int64_t flight_begin(const char* kind, int group, std::int64_t number, std::int64_t bytes,
                          const char* call, std::int64_t enter_us) {
  Ring* ring = g_ring.load(std::memory_order_acquire);
  if (ring == nullptr) return 0;
  const std::int64_t seq = g_next.fetch_add(1, std::memory_order_relaxed) + 1;
  Slot& s = ring->slots[static_cast<std::size_t>(seq % ring->cap)];
  s.seq.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const std::int64_t now = flight_now_us();
  s.rec.seq = seq;
  s.rec.group = group;
  s.rec.number = number > 0 ? number : seq;
  s.rec.bytes = bytes;
  s.rec.kind = kind != nullptr ? kind : "";
  s.rec.call = call != nullptr ? call : "";
  s.rec.enter_us = enter_us > 0 && enter_us <= now ? enter_us : now;
  s.rec.start_us = now;
  s.end_us.store(0, std::memory_order_relaxed);
  s.seq.store(seq, std::memory_order_release);
  return seq;
}

void flight_end(std::int64_t handle) {
  if (handle <= 0) return;
  Ring* ring = g_ring.load(std::memory_order_acquire);
  if (ring == nullptr) return;
  Slot& s = ring->slots[static_cast<std::size_t>(handle % ring->cap)];
  if (s.seq.load(std::memory_order_acquire) == handle)
    s.end_us.store(flight_now_us(), std::memory_order_release);
}

std::vector<FlightRecord> flight_records() {
  std::vector<FlightRecord> out;
  Ring* ring = g_ring.load(std::memory_order_acquire);
  if (ring == nullptr) return out;
  const std::int64_t last = g_next.load(std::memory_order_acquire);
  for (std::int64_t seq = std::max<std::int64_t>(1, last - ring->cap + 1); seq <= last; ++seq) {
    FlightRecord r;
    if (copy_record(ring->slots[static_cast<std::size_t>(seq % ring->cap)], seq, &r))
      out.push_back(r);
  }
  return out;
}

bool flight_dump(const char* reason, const char* why) {
  if (g_path[0] == '\0' || g_ring.load() == nullptr || g_dumped.load()) return false;
  int idle = 0;
  if (!g_dumping.compare_exchange_strong(idle, 1)) return false;
  bool ok = false;
  const int fd = ::open(g_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    {
      Out out(fd);
      write_dump(out, reason, why);
      out.flush();
      ok = out.ok();
    }
    ::close(fd);
    ok = ok && ::rename(g_tmp, g_path) == 0;
  }
  if (ok) g_dumped.store(true);
  g_dumping.store(0);
  return ok;
}

}  // namespace fluxmpi
