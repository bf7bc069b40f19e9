#include "runtime/stall_answer.h"

#include <vector>

namespace fluxmpi {
namespace {

constexpr char kSep = '\x1e';

std::string join_counts(const std::vector<std::int64_t>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::vector<std::int64_t> split_counts(const std::string& s) {
  std::vector<std::int64_t> out;
  std::size_t pos = 0;
  while (pos < s.size()) {
    auto comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(std::stoll(s.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

}  // namespace

std::string serialize_answer(const Answer& a) {
  const auto& s = a.status;
  std::string out;
  for (const std::string& f :
       {std::to_string(a.round), std::to_string(s.group), std::to_string(s.number),
        std::string(s.active ? "1" : "0"), std::to_string(s.for_s), join_counts(s.counts), s.kind,
        s.call, s.detail, a.stack, a.site}) {
    out += f;
    out += kSep;
  }
  return out;
}

std::optional<Answer> parse_answer(const std::string& in) {
  std::vector<std::string> f;
  std::size_t pos = 0;
  for (std::size_t next; (next = in.find(kSep, pos)) != std::string::npos; pos = next + 1)
    f.push_back(in.substr(pos, next - pos));
  if (f.size() != 11) return std::nullopt;
  Answer a;
  try {
    a.round = std::stoll(f[0]);
    a.status.group = std::stoi(f[1]);
    a.status.number = std::stoll(f[2]);
    a.status.active = f[3] == "1";
    a.status.for_s = std::stod(f[4]);
    a.status.counts = split_counts(f[5]);
  } catch (...) {
    return std::nullopt;
  }
  a.status.kind = f[6];
  a.status.call = f[7];
  a.status.detail = f[8];
  a.stack = f[9];
  a.site = f[10];
  return a;
}

}  // namespace fluxmpi
