// GradientReducer's bookkeeping beside the step (ops/gradient_reducer.h): the parameters'
// names and the buckets' labels for messages and stall reports, and the requires_grad watch
// that tells the caller to re-plan.
#include <string>
#include <vector>

#include "ops/gradient_reducer.h"

namespace fluxmpi {

void GradientReducer::name_parameters(const std::vector<std::string>& names) {
  names_ = names;
  constexpr std::size_t kNamed = 3;  // first parameter names a label shows
  labels_.clear();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::string label =
        "gradient bucket " + std::to_string(b + 1) + " of " + std::to_string(buckets_.size());
    const auto& members = buckets_[b].members;
    for (std::size_t k = 0; k < members.size() && k < kNamed; ++k) {
      auto i = static_cast<std::size_t>(members[k]);
      if (i >= names.size()) break;
      label += (k ? ", " : ": ") + names[i];
      if (k + 1 == kNamed && members.size() > kNamed)
        label += " (+" + std::to_string(members.size() - kNamed) + " more)";
    }
    labels_.push_back(std::move(label));
  }
}

std::string GradientReducer::param_label(std::int64_t i) const {
  const auto k = static_cast<std::size_t>(i);
  return k < names_.size() && !names_[k].empty() ? names_[k] : std::to_string(i);
}

void GradientReducer::watch_requires_grad(std::vector<at::Tensor> tensors) {
  watched_ = std::move(tensors);
  watched_flags_.resize(watched_.size());
  for (std::size_t i = 0; i < watched_.size(); ++i) watched_flags_[i] = watched_[i].requires_grad();
}

bool GradientReducer::requires_grad_changed() const {
  for (std::size_t i = 0; i < watched_.size(); ++i) {
    if (watched_[i].requires_grad() != static_cast<bool>(watched_flags_[i])) return true;
  }
  return false;
}

}  // namespace fluxmpi
