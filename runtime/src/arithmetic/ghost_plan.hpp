#pragma once
// Which rows a ghost exchange moves (kvmap::GhostExchange): a pure plan built in three rounds of
// sparse messages from each rank's owned item ids and ghost item ids, with no table of size P
// or of the global item count anywhere. Every id has a directory rank (a hash of the id):
//   1. each rank sends its owned ids to their directory ranks;
//   2. each rank sends its distinct ghost ids to their directory ranks (queries);
//   3. each directory rank answers every query with a record (id, requester, owner), sent to
//      the requester and, when another rank owns the id, to the owner;
// then each rank finishes its routes alone: what it sends to each requester (owned rows, in
// ascending id order) and where each ghost row's value comes from (a received row, or one of
// its own rows for an id it owns itself, e.g. a periodic image). Sender and receiver order each
// pair's rows by id, so they agree on every message without another round. Cost per rank:
// proportional to its owned and ghost ids and to the ranks it exchanges with. The rounds'
// messages travel through Transport::sparse_exchange; tests run them in one process at
// thousands of ranks.
#include <cstdint>
#include <string>
#include <vector>

#include "detail.hpp"

namespace kvmap::Detail {

// int64 words to (or from) one rank.
struct IdMessage {
  int peer = 0;
  std::vector<std::int64_t> words;
};

// The rank of P that keeps id's directory entry: spread for any pattern of ids.
int directory_of(std::int64_t id, int nranks);

// Rounds 1 and 2: the ids grouped by directory rank (distinct ids, ascending in each message).
std::vector<IdMessage> to_directories(const std::vector<std::int64_t>& ids, int nranks);

// Round 3 at a directory rank: from the owned ids it received (each message's peer the owner)
// and the queries (each message's peer the requester), the records (id, requester, owner) for
// the requesters and the owners; owner -1 where no rank owns the id. An id two ranks (or one
// rank twice) own is an error: `problem` says which.
struct DirectoryAnswer {
  std::vector<IdMessage> records;
  std::string problem;
};
DirectoryAnswer answer_queries(const std::vector<IdMessage>& owned_in,
                               const std::vector<IdMessage>& queries_in);

// One rank's routes, from its ids and the records it received.
struct GhostRoutes {
  struct Peer {
    int peer = 0;
    std::vector<std::int64_t> rows;  // sends: owned rows, in the order the peer receives them
  };
  std::vector<Peer> sends;  // ascending peer order
  struct Count {
    int peer = 0;
    std::int64_t rows = 0;  // received rows, packed in ascending peer order
  };
  std::vector<Count> recvs;
  // Ghost rows filled from received rows: ghost row remote_ghost[k] (0-based among the ghosts)
  // takes packed received row remote_pos[k].
  std::vector<std::int64_t> remote_ghost, remote_pos;
  // Ghost rows whose id this rank owns: ghost row self_ghost[k] takes owned row self_row[k].
  std::vector<std::int64_t> self_ghost, self_row;
  std::int64_t rows_sent = 0, rows_received = 0;
  std::string problem;  // a ghost id nobody owns (the first one), empty if none
};
GhostRoutes finish_routes(int me, const std::vector<std::int64_t>& owned,
                          const std::vector<std::int64_t>& ghosts,
                          const std::vector<IdMessage>& records_in);

}  // namespace kvmap::Detail
