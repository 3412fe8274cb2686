// The plan of a ghost exchange (ghost_plan.hpp).
#include "ghost_plan.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_map>

#include "hash.hpp"

namespace kvmap::Detail {

int directory_of(std::int64_t id, int nranks) {
  return static_cast<int>(mix64(static_cast<std::uint64_t>(id) + kGolden) %
                          static_cast<std::uint64_t>(nranks));
}

std::vector<IdMessage> to_directories(const std::vector<std::int64_t>& ids, int nranks) {
  std::vector<std::int64_t> distinct(ids);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::map<int, std::vector<std::int64_t>> by_rank;
  for (std::int64_t id : distinct) by_rank[directory_of(id, nranks)].push_back(id);
  std::vector<IdMessage> out;
  out.reserve(by_rank.size());
  for (auto& [peer, words] : by_rank) out.push_back({peer, std::move(words)});
  return out;
}

DirectoryAnswer answer_queries(const std::vector<IdMessage>& owned_in,
                               const std::vector<IdMessage>& queries_in) {
  DirectoryAnswer answer;
  std::unordered_map<std::int64_t, int> owner;
  for (const IdMessage& m : owned_in) {
    for (std::int64_t id : m.words) {
      auto [it, inserted] = owner.emplace(id, m.peer);
      if (!inserted && answer.problem.empty()) {
        std::ostringstream s;
        s << "item id " << id << " is owned by rank " << std::min(it->second, m.peer)
          << " and rank " << std::max(it->second, m.peer)
          << " (each id must be owned by exactly one rank)";
        answer.problem = s.str();
      }
    }
  }
  std::map<int, std::vector<std::int64_t>> records;
  for (const IdMessage& q : queries_in) {
    for (std::int64_t id : q.words) {
      const auto it = owner.find(id);
      const int own = it == owner.end() ? -1 : it->second;
      const std::int64_t record[] = {id, q.peer, own};
      std::vector<std::int64_t>& to_requester = records[q.peer];
      to_requester.insert(to_requester.end(), record, record + 3);
      if (own >= 0 && own != q.peer) {
        std::vector<std::int64_t>& to_owner = records[own];
        to_owner.insert(to_owner.end(), record, record + 3);
      }
    }
  }
  answer.records.reserve(records.size());
  for (auto& [peer, words] : records) answer.records.push_back({peer, std::move(words)});
  return answer;
}

GhostRoutes finish_routes(int me, const std::vector<std::int64_t>& owned,
                          const std::vector<std::int64_t>& ghosts,
                          const std::vector<IdMessage>& records_in) {
  GhostRoutes routes;
  std::unordered_map<std::int64_t, std::int64_t> row_of;
  row_of.reserve(owned.size());
  for (std::size_t r = 0; r < owned.size(); ++r)
    row_of.emplace(owned[r], static_cast<std::int64_t>(r));
  std::map<int, std::vector<std::int64_t>> wanted;  // requester -> ids it takes from this rank
  std::map<int, std::vector<std::int64_t>> from;    // owner -> ids this rank takes from it
  std::unordered_map<std::int64_t, int> owner_of;
  for (const IdMessage& m : records_in) {
    for (std::size_t k = 0; k + 2 < m.words.size(); k += 3) {
      const std::int64_t id = m.words[k];
      const int requester = static_cast<int>(m.words[k + 1]);
      const int owner = static_cast<int>(m.words[k + 2]);
      if (requester == me) {
        owner_of[id] = owner;
        if (owner >= 0 && owner != me) from[owner].push_back(id);
      }
      if (owner == me && requester != me) wanted[requester].push_back(id);
    }
  }
  for (auto& [peer, ids] : wanted) {
    std::sort(ids.begin(), ids.end());
    GhostRoutes::Peer p{peer, {}};
    p.rows.reserve(ids.size());
    for (std::int64_t id : ids) p.rows.push_back(row_of.at(id));
    routes.rows_sent += static_cast<std::int64_t>(p.rows.size());
    routes.sends.push_back(std::move(p));
  }
  std::unordered_map<std::int64_t, std::int64_t> position;
  for (auto& [peer, ids] : from) {
    std::sort(ids.begin(), ids.end());
    for (std::int64_t id : ids) position.emplace(id, routes.rows_received++);
    routes.recvs.push_back({peer, static_cast<std::int64_t>(ids.size())});
  }
  for (std::size_t j = 0; j < ghosts.size(); ++j) {
    const std::int64_t id = ghosts[j];
    const auto it = owner_of.find(id);
    const int owner = it == owner_of.end() ? -1 : it->second;
    if (owner < 0) {
      if (routes.problem.empty()) {
        std::ostringstream s;
        s << "ghost id " << id << " (ghost row " << j << ") is owned by no rank";
        routes.problem = s.str();
      }
      continue;
    }
    const auto g = static_cast<std::int64_t>(j);
    if (owner == me) {
      routes.self_ghost.push_back(g);
      routes.self_row.push_back(row_of.at(id));
    } else {
      routes.remote_ghost.push_back(g);
      routes.remote_pos.push_back(position.at(id));
    }
  }
  return routes;
}

}  // namespace kvmap::Detail
