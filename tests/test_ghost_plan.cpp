// The ghost exchange's plan (runtime/src/arithmetic/ghost_plan): its three rounds of messages
// delivered in one process at up to thousands of ranks, the routes checked against the owners
// known here (every ghost row gets its owner's value), and what a rank sends counted: it grows
// with the rank's own ids and the ranks it exchanges with, not with the number of ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ghost_plan.hpp"

using kvmap::Detail::answer_queries;
using kvmap::Detail::directory_of;
using kvmap::Detail::finish_routes;
using kvmap::Detail::GhostRoutes;
using kvmap::Detail::IdMessage;
using kvmap::Detail::to_directories;

namespace {

using Inboxes = std::vector<std::vector<IdMessage>>;

// One round: every rank's outgoing messages to their peers (each received message's peer is
// its sender); the largest word count a rank sent.
Inboxes deliver(const std::vector<std::vector<IdMessage>>& out, std::size_t& max_sent) {
  Inboxes in(out.size());
  for (std::size_t r = 0; r < out.size(); ++r) {
    std::size_t sent = 0;
    for (const IdMessage& m : out[r]) {
      in[static_cast<std::size_t>(m.peer)].push_back({static_cast<int>(r), m.words});
      sent += m.words.size();
    }
    max_sent = std::max(max_sent, sent);
  }
  return in;
}

struct Run {
  std::vector<GhostRoutes> routes;
  std::vector<std::string> directory_problems;
  std::size_t max_words_sent = 0;  // by one rank in one round
};

Run plan_all(const std::vector<std::vector<std::int64_t>>& owned,
             const std::vector<std::vector<std::int64_t>>& ghosts) {
  const int P = static_cast<int>(owned.size());
  Run run;
  std::vector<std::vector<IdMessage>> r1, r2, r3;
  for (int r = 0; r < P; ++r) {
    r1.push_back(to_directories(owned[static_cast<std::size_t>(r)], P));
    r2.push_back(to_directories(ghosts[static_cast<std::size_t>(r)], P));
  }
  const Inboxes owned_in = deliver(r1, run.max_words_sent);
  const Inboxes queries_in = deliver(r2, run.max_words_sent);
  for (int r = 0; r < P; ++r) {
    auto answer = answer_queries(owned_in[static_cast<std::size_t>(r)],
                                 queries_in[static_cast<std::size_t>(r)]);
    run.directory_problems.push_back(answer.problem);
    r3.push_back(std::move(answer.records));
  }
  const Inboxes records_in = deliver(r3, run.max_words_sent);
  for (int r = 0; r < P; ++r) {
    run.routes.push_back(finish_routes(r, owned[static_cast<std::size_t>(r)],
                                       ghosts[static_cast<std::size_t>(r)],
                                       records_in[static_cast<std::size_t>(r)]));
  }
  return run;
}

// Every rank's ghost rows from the routes: what each rank sends (its owned ids, row by row)
// delivered in peer order, then each ghost row from its received row or its own row.
void check_routes(const std::vector<std::vector<std::int64_t>>& owned,
                  const std::vector<std::vector<std::int64_t>>& ghosts, const Run& run) {
  const int P = static_cast<int>(owned.size());
  // packets[to][from]: the ids `from` sends `to`, in order.
  std::vector<std::map<int, std::vector<std::int64_t>>> packets(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    for (const GhostRoutes::Peer& p : run.routes[static_cast<std::size_t>(r)].sends) {
      CHECK(p.peer != r);
      auto& packet = packets[static_cast<std::size_t>(p.peer)][r];
      for (std::int64_t row : p.rows) packet.push_back(owned[static_cast<std::size_t>(r)][row]);
    }
  }
  for (int r = 0; r < P; ++r) {
    const GhostRoutes& g = run.routes[static_cast<std::size_t>(r)];
    CHECK(g.problem.empty());
    std::vector<std::int64_t> received;
    REQUIRE(g.recvs.size() == packets[static_cast<std::size_t>(r)].size());
    std::size_t k = 0;
    for (const auto& [from, ids] : packets[static_cast<std::size_t>(r)]) {
      CHECK(g.recvs[k].peer == from);
      CHECK(g.recvs[k].rows == static_cast<std::int64_t>(ids.size()));
      received.insert(received.end(), ids.begin(), ids.end());
      ++k;
    }
    CHECK(g.rows_received == static_cast<std::int64_t>(received.size()));
    const auto& gh = ghosts[static_cast<std::size_t>(r)];
    std::vector<std::int64_t> filled(gh.size(), -1);
    for (std::size_t i = 0; i < g.remote_ghost.size(); ++i)
      filled[static_cast<std::size_t>(g.remote_ghost[i])] =
          received[static_cast<std::size_t>(g.remote_pos[i])];
    for (std::size_t i = 0; i < g.self_ghost.size(); ++i)
      filled[static_cast<std::size_t>(g.self_ghost[i])] =
          owned[static_cast<std::size_t>(r)][static_cast<std::size_t>(g.self_row[i])];
    CHECK(filled == gh);
    // Each id travels once per pair of ranks, however often it repeats among the ghosts.
    CHECK(std::set<std::int64_t>(received.begin(), received.end()).size() == received.size());
  }
}

}  // namespace

TEST_CASE("ghost plan: random owners and ghosts (repeats, own ids, empty ranks)") {
  std::mt19937_64 rng(7);
  for (int P : {1, 2, 3, 5, 17, 64}) {
    INFO("P=" << P);
    const int items = 40 * P;
    std::vector<std::vector<std::int64_t>> owned(static_cast<std::size_t>(P)),
        ghosts(static_cast<std::size_t>(P));
    std::vector<std::int64_t> ids;
    for (int k = 0; k < items; ++k)
      ids.push_back(static_cast<std::int64_t>(rng() >> 2) - (1ll << 60));
    for (std::int64_t id : ids) {
      int r = static_cast<int>(rng() % static_cast<std::uint64_t>(P));
      if (P > 3 && r == 3) r = 0;  // rank 3 owns nothing
      owned[static_cast<std::size_t>(r)].push_back(id);
    }
    for (int r = 0; r < P; ++r) {
      const int n = r == 2 ? 0 : static_cast<int>(rng() % 30);  // rank 2 has no ghosts
      for (int k = 0; k < n; ++k)
        ghosts[static_cast<std::size_t>(r)].push_back(ids[rng() % ids.size()]);
    }
    const Run run = plan_all(owned, ghosts);
    for (const std::string& p : run.directory_problems) CHECK(p.empty());
    check_routes(owned, ghosts, run);
  }
}

TEST_CASE("ghost plan: a chain of 4,096 ranks, cost per rank independent of P") {
  // Rank r owns ids [100 r, 100 r + 100) and ghosts 10 ids of each neighbour (periodic).
  for (int P : {64, 4096}) {
    std::vector<std::vector<std::int64_t>> owned(static_cast<std::size_t>(P)),
        ghosts(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
      for (int k = 0; k < 100; ++k) owned[static_cast<std::size_t>(r)].push_back(100ll * r + k);
      const int left = (r + P - 1) % P, right = (r + 1) % P;
      for (int k = 0; k < 10; ++k) {
        ghosts[static_cast<std::size_t>(r)].push_back(100ll * left + 90 + k);
        ghosts[static_cast<std::size_t>(r)].push_back(100ll * right + k);
      }
    }
    const Run run = plan_all(owned, ghosts);
    check_routes(owned, ghosts, run);
    for (const GhostRoutes& g : run.routes) {
      CHECK(g.sends.size() == 2);
      CHECK(g.recvs.size() == 2);
      CHECK(g.rows_sent == 20);
      CHECK(g.rows_received == 20);
    }
    // A rank sends its 100 owned ids and 20 queries, and answers the queries its directory
    // entries get (6 words each at most): a few hundred words at any P (the hash spreads
    // the directory; 1,000 is far above what one rank gets at P = 64 or 4,096).
    INFO("P=" << P << " max words one rank sent in one round: " << run.max_words_sent);
    CHECK(run.max_words_sent <= 1000);
  }
}

TEST_CASE("ghost plan: an unowned ghost id and an id owned twice are reported") {
  const int P = 4;
  std::vector<std::vector<std::int64_t>> owned = {{1, 2}, {3}, {4, 2}, {}};
  std::vector<std::vector<std::int64_t>> ghosts = {{3, 9}, {1}, {}, {4}};
  const Run run = plan_all(owned, ghosts);
  const int directory = directory_of(2, P);
  for (int r = 0; r < P; ++r) {
    if (r == directory) {
      CHECK(run.directory_problems[static_cast<std::size_t>(r)] ==
            "item id 2 is owned by rank 0 and rank 2 (each id must be owned by exactly one rank)");
    } else {
      CHECK(run.directory_problems[static_cast<std::size_t>(r)].find("item id 2") ==
            std::string::npos);
    }
  }
  CHECK(run.routes[0].problem == "ghost id 9 (ghost row 1) is owned by no rank");
  CHECK(run.routes[1].problem.empty());
  CHECK(run.routes[3].problem.empty());
  CHECK(directory_of(-5, 7) >= 0);
  CHECK(directory_of(std::numeric_limits<std::int64_t>::min(), 7) < 7);
}
