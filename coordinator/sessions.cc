#include "coordinator/sessions.h"

namespace strata::coordinator {

std::optional<SessionEntry> SessionTable::Get(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  return it->second;
}

bool SessionTable::Update(const std::string& id, bool create, const std::function<void(SessionEntry&)>& fn) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    if (!create) return false;
    it = sessions_.emplace(id, SessionEntry{}).first;
    it->second.id = id;
  }
  fn(it->second);
  return true;
}

bool SessionTable::Erase(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  return sessions_.erase(id) > 0;
}

std::vector<SessionEntry> SessionTable::List(const std::string& prefix) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<SessionEntry> out;
  for (const auto& [id, s] : sessions_) {
    if (id.rfind(prefix, 0) == 0) out.push_back(s);
  }
  return out;
}

void SessionTable::DropResidency() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [id, s] : sessions_) s.seq_id = 0;
}

int64_t SessionTable::resident() {
  std::lock_guard<std::mutex> l(mu_);
  int64_t n = 0;
  for (const auto& [id, s] : sessions_) n += s.seq_id != 0;
  return n;
}

}  // namespace strata::coordinator
