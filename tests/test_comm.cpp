// kvmap::Comm, the one module of kvmap that calls MPI, against independent references: the raw
// MPI call on MPI_COMM_WORLD (or on a communicator made with raw MPI calls) and plain local
// arithmetic, never kvmap itself. Any number of ranks; every rank takes the same collective
// path.
#include "support/kvmap_test.hpp"
#include "comm_registry.hpp"
#include "agreement.hpp"  // message_of
#include "hooks.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

using kvmap::Comm;
namespace Detail = kvmap::Detail;
using kvmap::DType;

namespace {

int mpi_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int mpi_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

using Bytes = std::vector<unsigned char>;

// Byte i of the data that `who` contributes (plain arithmetic, the same on every rank).
unsigned char byte_of(int who, std::size_t i, int salt) {
  return static_cast<unsigned char>((who * 131 + static_cast<int>(i % 1000) * 29 + salt * 7 + 1) %
                                    251);
}
Bytes bytes_of(int who, std::size_t n, int salt) {
  Bytes out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = byte_of(who, i, salt);
  return out;
}

// 1,000 bytes of root's broadcast by comm.bcast_bytes: the same as one MPI_Bcast of them on
// MPI_COMM_WORLD, and root's pattern on every rank.
void check_bcast_bytes(const kvmap::Comm& comm, int root, int salt) {
  const std::size_t n = 1000;
  Bytes got = comm.rank() == root ? bytes_of(root, n, salt) : Bytes(n, 0xee);
  Bytes ref = got;
  kvmap::Detail::transport(comm).bcast_bytes(got.data(), n, root);
  MPI_Bcast(ref.data(), static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD);
  CHECK(got == ref);
  CHECK(got == bytes_of(root, n, salt));
}

// Lowers the MPI count limit for one scope and restores it, passing or failing.
struct CountLimit {
  explicit CountLimit(std::size_t limit) : saved(kvmap::Detail::mpi_count_limit()) {
    kvmap::Detail::set_mpi_count_limit(limit);
  }
  ~CountLimit() { kvmap::Detail::set_mpi_count_limit(saved); }
  CountLimit(const CountLimit&) = delete;
  CountLimit& operator=(const CountLimit&) = delete;
  const std::size_t saved;
};

// A value of rank `who` at index i: small integers of both signs, exact in every type used.
int value_of(int who, std::size_t i) {
  return static_cast<int>((who * 7 + static_cast<int>(i) * 3) % 11) - 5;
}

// Sum and max over ranks of n values of type T through Comm, against MPI_Allreduce on the
// world and against the plain sum and max of every rank's values.
template <class T>
void check_sum_and_max(const Comm& comm, DType dtype, MPI_Datatype mpi_type, std::size_t n) {
  INFO("dtype " << kvmap::name(dtype) << ", " << n << " values");
  const int me = mpi_rank(), P = mpi_size();
  std::vector<T> mine(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<T>(value_of(me, i));
  std::vector<T> sum = mine, max = mine;
  kvmap::Detail::transport(comm).allreduce_sum(sum.data(), n, dtype);
  kvmap::Detail::transport(comm).allreduce_max(max.data(), n, dtype);
  std::vector<T> ref_sum(n), ref_max(n);
  MPI_Allreduce(mine.data(), ref_sum.data(), static_cast<int>(n), mpi_type, MPI_SUM,
                MPI_COMM_WORLD);
  MPI_Allreduce(mine.data(), ref_max.data(), static_cast<int>(n), mpi_type, MPI_MAX,
                MPI_COMM_WORLD);
  CHECK(sum == ref_sum);
  CHECK(max == ref_max);
  std::vector<T> plain_sum(n, T(0)), plain_max(n);
  for (std::size_t i = 0; i < n; ++i) {
    plain_max[i] = static_cast<T>(value_of(0, i));
    for (int r = 0; r < P; ++r) {
      plain_sum[i] = static_cast<T>(plain_sum[i] + static_cast<T>(value_of(r, i)));
      plain_max[i] = std::max(plain_max[i], static_cast<T>(value_of(r, i)));
    }
  }
  CHECK(sum == plain_sum);
  CHECK(max == plain_max);
  // The typed one-value forms.
  CHECK(kvmap::Detail::transport(comm).allreduce_sum(mine[0]) == ref_sum[0]);
  CHECK(kvmap::Detail::transport(comm).allreduce_max(mine[n - 1]) == ref_max[n - 1]);
}

// A record {min, max, sum} of int64 values and the MPI user function that combines two.
struct MinMaxSum {
  std::int64_t min, max, sum;
};
void combine_min_max_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const MinMaxSum*>(in);
  auto* b = static_cast<MinMaxSum*>(inout);
  for (int k = 0; k < *len; ++k) {
    b[k].min = std::min(a[k].min, b[k].min);
    b[k].max = std::max(a[k].max, b[k].max);
    b[k].sum += a[k].sum;
  }
}

// The point-to-point pattern of the Exchange tests: rank `from` sends len(from, to) bytes to
// every rank `to`, itself included (empty where (from + to) % 3 == 2). The sender places its
// messages by destination after a 3-byte gap each; the receiver places them by source in
// reverse rank order after a 2-byte gap each. Gaps keep a sentinel.
struct Pattern {
  int P;
  std::size_t base;  // bytes of the shortest message
  std::size_t len(int from, int to) const {
    return (from + to) % 3 == 2 ? 0 : base + 4 * from + 9 * to;
  }
  std::size_t send_offset(int from, int to) const {
    std::size_t at = 0;
    for (int q = 0; q < to; ++q) at += 3 + len(from, q);
    return at + 3;
  }
  std::size_t send_bytes(int from) const { return send_offset(from, P); }
  std::size_t recv_offset(int to, int from) const {
    std::size_t at = 0;
    for (int r = P - 1; r > from; --r) at += 2 + len(r, to);
    return at + 2;
  }
  std::size_t recv_bytes(int to) const { return recv_offset(to, -1); }
  // Message from -> to: bytes_of(from * P + to, len, salt).
  Bytes send_buffer(int from, int salt) const {
    Bytes out(send_bytes(from), 0xab);
    for (int q = 0; q < P; ++q) {
      const Bytes m = bytes_of(from * P + q, len(from, q), salt);
      std::copy(m.begin(), m.end(),
                out.begin() + static_cast<std::ptrdiff_t>(send_offset(from, q)));
    }
    return out;
  }
  Bytes expected_recv(int to, int salt) const {
    Bytes out(recv_bytes(to), 0xee);
    for (int r = 0; r < P; ++r) {
      const Bytes m = bytes_of(r * P + to, len(r, to), salt);
      std::copy(m.begin(), m.end(), out.begin() + static_cast<std::ptrdiff_t>(recv_offset(to, r)));
    }
    return out;
  }
  Detail::Messages plan(int me) const {
    Detail::Messages x;
    for (int q = 0; q < P; ++q) x.send(q, send_offset(me, q), len(me, q));
    for (int r = 0; r < P; ++r) x.recv(r, recv_offset(me, r), len(r, me));
    return x;
  }
  // Messages the plan holds with contiguous messages cut into pieces of at most `limit`.
  std::size_t messages(int me, std::size_t limit) const {
    std::size_t n = 0;
    for (int q = 0; q < P; ++q)
      n += (len(me, q) + limit - 1) / limit + (len(q, me) + limit - 1) / limit;
    return n;
  }
};

}  // namespace

TEST_CASE("comm: rank and size are MPI's; a communicator made twice is one duplicate") {
  const int me = mpi_rank(), P = mpi_size();
  const Comm world = Comm::world();
  CHECK(world.rank() == me);
  CHECK(world.size() == P);
  const Comm made;  // the world too
  CHECK(made.id() == world.id());
  CHECK(made.rank() == me);
  CHECK(made.size() == P);
  // kvmap's duplicate, not the user's communicator: the same group in the same order.
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(world.raw(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT);
  // The world's id is the same on every rank: its minimum and maximum over the world.
  std::uint64_t id = world.id(), lo = 0, hi = 0;
  MPI_Allreduce(&id, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&id, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == id);
  CHECK(hi == id);
  CHECK(Comm::from_fortran(MPI_Comm_c2f(MPI_COMM_WORLD)).id() == world.id());

  const Comm self = Comm::self();
  CHECK(self.rank() == 0);
  CHECK(self.size() == 1);
  MPI_Comm_compare(self.raw(), MPI_COMM_SELF, &cmp);
  CHECK(cmp == MPI_CONGRUENT);
  CHECK(self.id() != world.id());

  // A user communicator made with raw MPI: the ranks of one parity, in reverse order.
  const int color = me % 2;
  MPI_Comm user = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, -me, &user);
  int user_rank = -1, user_size = -1;
  MPI_Comm_rank(user, &user_rank);
  MPI_Comm_size(user, &user_size);
  const int expect_size = (P - color + 1) / 2;  // color, color + 2, ... below P
  CHECK(user_size == expect_size);
  CHECK(user_rank == expect_size - 1 - me / 2);
  const Comm a(user), b(user);
  CHECK(a.rank() == user_rank);
  CHECK(a.size() == user_size);
  CHECK(b.rank() == user_rank);
  CHECK(b.size() == user_size);
  CHECK(a.id() == b.id());
  CHECK(a.raw() == b.raw());
  CHECK(a.id() != world.id());
  CHECK(a.id() != self.id());
  MPI_Comm_compare(a.raw(), user, &cmp);
  CHECK(cmp == MPI_CONGRUENT);
  id = a.id();
  MPI_Allreduce(&id, &lo, 1, MPI_UINT64_T, MPI_MIN, user);
  MPI_Allreduce(&id, &hi, 1, MPI_UINT64_T, MPI_MAX, user);
  CHECK(lo == id);
  CHECK(hi == id);
  CHECK(Comm::from_fortran(MPI_Comm_c2f(user)).id() == a.id());
  // The user frees their communicator; kvmap's duplicate stays usable.
  MPI_Comm_free(&user);
  int dup_size = -1;
  MPI_Comm_size(a.raw(), &dup_size);
  CHECK(dup_size == expect_size);
  a.barrier();
}

TEST_CASE("comm: next_sequence counts per user communicator, shared by all its Comms") {
  MPI_Comm user = MPI_COMM_NULL, other = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &user);
  MPI_Comm_dup(MPI_COMM_WORLD, &other);
  const Comm a(user), b(user), c(other);
  MPI_Comm_free(&user);
  MPI_Comm_free(&other);
  CHECK(kvmap::Detail::next_sequence(a, 3) == 1);
  CHECK(kvmap::Detail::next_sequence(b, 3) == 2);  // b is a Comm of the same communicator
  CHECK(kvmap::Detail::next_sequence(Comm(a), 3) == 3);
  CHECK(kvmap::Detail::next_sequence(c, 3) == 1);  // another communicator: its own sequence
  CHECK(kvmap::Detail::next_sequence(a, 4) == 1);  // a new epoch starts again at 1
  CHECK(kvmap::Detail::next_sequence(b, 4) == 2);
  CHECK(kvmap::Detail::next_sequence(b, 3) == 1);
  CHECK(kvmap::Detail::next_sequence(c, 3) == 2);
}

TEST_CASE("comm: collectives deliver what the raw MPI call on the world delivers") {
  const int me = mpi_rank(), P = mpi_size();
  const Comm comm = Comm::world();

  // allgather_bytes: 13 bytes of every rank, in rank order.
  {
    const std::size_t n = 13;
    const Bytes mine = bytes_of(me, n, 1);
    Bytes got(n * P, 0), ref(n * P, 0), plain;
    kvmap::Detail::transport(comm).allgather_bytes(mine.data(), n, got.data());
    MPI_Allgather(mine.data(), static_cast<int>(n), MPI_BYTE, ref.data(), static_cast<int>(n),
                  MPI_BYTE, MPI_COMM_WORLD);
    CHECK(got == ref);
    for (int r = 0; r < P; ++r) {
      const Bytes theirs = bytes_of(r, n, 1);
      plain.insert(plain.end(), theirs.begin(), theirs.end());
    }
    CHECK(got == plain);
  }

  // allgather<T> of a trivially copyable record.
  {
    struct Record {
      std::int32_t rank;
      double value;
      char tag[3];
    };
    Record mine;
    std::memset(&mine, 0, sizeof mine);
    mine.rank = me;
    mine.value = 0.25 * me - 1.0;
    mine.tag[0] = 'r';
    mine.tag[1] = static_cast<char>('0' + me % 10);
    const std::vector<Record> got = kvmap::Detail::transport(comm).allgather(mine);
    std::vector<Record> ref(static_cast<std::size_t>(P));
    MPI_Allgather(&mine, sizeof(Record), MPI_BYTE, ref.data(), sizeof(Record), MPI_BYTE,
                  MPI_COMM_WORLD);
    REQUIRE(got.size() == static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
      CHECK(got[r].rank == ref[r].rank);
      CHECK(got[r].value == ref[r].value);
      CHECK(std::memcmp(got[r].tag, ref[r].tag, sizeof ref[r].tag) == 0);
      CHECK(got[r].rank == r);
    }
  }

  // bcast_bytes and bcast_string from every root.
  for (int root = 0; root < P; ++root) {
    INFO("root " << root);
    check_bcast_bytes(comm, root, 2);
    const auto text = [](int r) { return "rank " + std::to_string(r) + std::string(5 * r, 'x'); };
    CHECK(kvmap::Detail::transport(comm).bcast_string(text(me), root) == text(root));
    // Root's empty string, whatever the others pass.
    CHECK(kvmap::Detail::transport(comm)
              .bcast_string(me == root ? std::string() : text(me), root)
              .empty());
  }

  // allreduce_sum / allreduce_max of several dtypes.
  check_sum_and_max<std::int32_t>(comm, DType::Int32, MPI_INT32_T, 17);
  check_sum_and_max<std::int64_t>(comm, DType::Int64, MPI_INT64_T, 17);
  check_sum_and_max<float>(comm, DType::Float32, MPI_FLOAT, 17);
  check_sum_and_max<double>(comm, DType::Float64, MPI_DOUBLE, 17);
  check_sum_and_max<std::int8_t>(comm, DType::Int8, MPI_INT8_T, 3);
  // Refused on every rank before any MPI call: max of complex values, 16-bit floats.
  {
    float c[2] = {1.0f, 2.0f};
    CHECK_THROWS_AS(kvmap::Detail::transport(comm).allreduce_max(c, 1, DType::Complex64),
                    kvmap::TypeError);
    std::uint16_t h = 0;
    CHECK_THROWS_AS(kvmap::Detail::transport(comm).allreduce_sum(&h, 1, DType::Float16),
                    kvmap::TypeError);
  }

  // allreduce_bytes with an MPI user function, against the three MPI reductions it combines.
  {
    const std::int64_t v = 1000 * static_cast<std::int64_t>(value_of(me, 5)) + me;
    MinMaxSum rec{v, v, v};
    kvmap::Detail::transport(comm).allreduce_bytes(&rec, sizeof rec, combine_min_max_sum);
    std::int64_t lo = 0, hi = 0, sum = 0;
    MPI_Allreduce(&v, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&v, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&v, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK(rec.min == lo);
    CHECK(rec.max == hi);
    CHECK(rec.sum == sum);
  }

  // allgatherv_bytes: rank r gives 5 + 3r bytes (none where r % 3 == 1), placed in reverse rank
  // order with 2-byte gaps that keep their sentinel.
  {
    const auto count = [](int r) { return r % 3 == 1 ? 0 : 5 + 3 * r; };
    std::vector<int> counts(P), displs(P);
    int at = 0;
    for (int r = P - 1; r >= 0; --r) {
      at += 2;
      counts[r] = count(r);
      displs[r] = at;
      at += counts[r];
    }
    const Bytes mine = bytes_of(me, static_cast<std::size_t>(count(me)), 3);
    Bytes got(static_cast<std::size_t>(at), 0xee), ref = got;
    kvmap::Detail::transport(comm).allgatherv_bytes(mine.data(), count(me), got.data(), counts,
                                                    displs);
    MPI_Allgatherv(mine.data(), count(me), MPI_BYTE, ref.data(), counts.data(), displs.data(),
                   MPI_BYTE, MPI_COMM_WORLD);
    Bytes plain(static_cast<std::size_t>(at), 0xee);
    for (int r = 0; r < P; ++r) {
      const Bytes theirs = bytes_of(r, static_cast<std::size_t>(count(r)), 3);
      std::copy(theirs.begin(), theirs.end(), plain.begin() + displs[r]);
    }
    CHECK(got == plain);
    // MPICH 4.0.2's own MPI_Allgatherv ignores the displacement on one rank (kvmap's does not):
    // the raw call is a second reference only where it agrees with the plain one.
    if (ref == plain) {
      CHECK(got == ref);
    } else {
      MESSAGE("this MPI's MPI_Allgatherv misplaces the block on " << P << " rank(s)");
      CHECK(P == 1);
    }
  }

  // alltoallw with box datatypes: rank me holds a 4 x P matrix of int32 (row-major) and sends
  // column p (strided) to rank p, which stores it as row `me` of its P x 4 matrix; then only
  // with the ranks of the same parity (the others' datatypes unset: nothing exchanged).
  // Reference: the columns packed by hand, MPI_Alltoallv of int32 on the world.
  for (bool sparse : {false, true}) {
    INFO("only ranks of the same parity " << sparse);
    const int rows = 4;
    const auto value = [](int from, int to, int i) { return from * 1000 + to * 10 + i; };
    const auto exchanges = [&](int p) { return !sparse || (p + me) % 2 == 0; };
    std::vector<std::int32_t> send(rows * P), packed(rows * P), got(P * rows, -1), ref = got;
    for (int i = 0; i < rows; ++i) {
      for (int p = 0; p < P; ++p) send[i * P + p] = value(me, p, i);
    }
    Detail::PeerTypes send_types(P), recv_types(P);
    std::vector<int> counts(P, 0), displs(P, 0);
    for (int p = 0; p < P; ++p) {
      displs[p] = p * rows;
      for (int i = 0; i < rows; ++i) packed[p * rows + i] = send[i * P + p];
      if (!exchanges(p)) continue;
      counts[p] = rows;
      const Detail::MpiDatatype column = Detail::box_type({rows}, {4 * P}, 4, 4 * p);
      const Detail::MpiDatatype row = Detail::box_type({rows}, {4}, 4, 4 * rows * p);
      int column_bytes = 0;
      MPI_Type_size(column.raw(), &column_bytes);
      CHECK(column_bytes == 4 * rows);
      send_types.set(p, column);
      recv_types.set(p, row);
    }
    std::size_t partners = 0;
    for (int p = 0; p < P; ++p) partners += exchanges(p) ? 1 : 0;
    CHECK(send_types.bytes() == partners * 4 * rows);
    CHECK(recv_types.bytes() == partners * 4 * rows);
    kvmap::Detail::transport(comm).alltoallw(send.data(), send_types, got.data(), recv_types);
    MPI_Alltoallv(packed.data(), counts.data(), displs.data(), MPI_INT32_T, ref.data(),
                  counts.data(), displs.data(), MPI_INT32_T, MPI_COMM_WORLD);
    CHECK(got == ref);
    for (int p = 0; p < P; ++p) {
      for (int i = 0; i < rows; ++i) {
        CHECK(got[p * rows + i] == (exchanges(p) ? value(p, me, i) : -1));
      }
    }
  }
  comm.barrier();
}

TEST_CASE("comm: Exchange delivers point-to-point messages at their offsets, to self too") {
  const int me = mpi_rank(), P = mpi_size();
  const Comm comm = Comm::world();
  const Pattern pattern{P, 7};
  Detail::Messages x = pattern.plan(me);
  CHECK(x.size() == pattern.messages(me, kvmap::Detail::mpi_count_limit()));
  Bytes recv(pattern.recv_bytes(me), 0xee);
  // Planned once, run any number of times: again with other data.
  for (int salt : {4, 5}) {
    INFO("run " << salt - 3);
    const Bytes send = pattern.send_buffer(me, salt);
    kvmap::Detail::transport(comm).run(x, send.data(), recv.data());
    CHECK(recv == pattern.expected_recv(me, salt));
  }
  // With Comm::self(): one message to self.
  const Comm self = Comm::self();
  Detail::Messages alone;
  const Bytes data = bytes_of(me, 40, 6);
  alone.send(0, 10, 20);
  alone.recv(0, 3, 20);
  CHECK(alone.size() == 2);
  Bytes got(30, 0xee), expect(30, 0xee);
  std::copy(data.begin() + 10, data.begin() + 30, expect.begin() + 3);
  kvmap::Detail::transport(self).run(alone, data.data(), got.data());
  CHECK(got == expect);
}

TEST_CASE("comm: under a small MPI count limit, large transfers arrive bit-identical") {
  const int me = mpi_rank(), P = mpi_size();
  const Comm comm = Comm::world();
  const std::size_t saved = kvmap::Detail::mpi_count_limit();
  {
    CountLimit limit(7);
    REQUIRE(kvmap::Detail::mpi_count_limit() == 7);
    // bcast_bytes and bcast_string in pieces of 7 bytes, against one unlimited MPI_Bcast.
    for (int root : {0, P - 1}) {
      INFO("root " << root);
      check_bcast_bytes(comm, root, 7);
      const std::string text(100, static_cast<char>('a' + root % 26));
      CHECK(kvmap::Detail::transport(comm).bcast_string(me == root ? text : std::string(3, '?'),
                                                        root) == text);
    }
    // Reductions in pieces of 7 elements.
    check_sum_and_max<std::int64_t>(comm, DType::Int64, MPI_INT64_T, 50);
    check_sum_and_max<double>(comm, DType::Float64, MPI_DOUBLE, 50);
    // Exchange: messages of about 1000 bytes cut into pieces of 7, the same on both sides.
    const Pattern pattern{P, 1000};
    Detail::Messages x = pattern.plan(me);
    CHECK(x.size() == pattern.messages(me, 7));
    Bytes recv(pattern.recv_bytes(me), 0xee);
    const Bytes send = pattern.send_buffer(me, 8);
    kvmap::Detail::transport(comm).run(x, send.data(), recv.data());
    CHECK(recv == pattern.expected_recv(me, 8));
    // Box datatypes whose contiguous run or extent exceeds the limit are refused (locally).
    CHECK_THROWS_AS(Detail::box_type({100}, {1}, 1, 0), kvmap::ValueError);
    CHECK_THROWS_AS(Detail::box_type({100}, {16}, 4, 0), kvmap::ValueError);
    const Detail::MpiDatatype fits = Detail::box_type({7}, {16}, 4, 0);
    int bytes = 0;
    MPI_Type_size(fits.raw(), &bytes);
    CHECK(bytes == 28);
    // An all-gather above the limit is refused on every rank (one rank gathers locally).
    if (P > 1) {
      Bytes mine(8, 1), all(8 * P);
      CHECK_THROWS_AS(
          kvmap::Detail::transport(comm).allgather_bytes(mine.data(), mine.size(), all.data()),
          kvmap::Error);
    }
  }
  CHECK(kvmap::Detail::mpi_count_limit() == saved);
}

TEST_CASE("comm: an emulated communicator reports its rank and size and makes no MPI call") {
  for (int size : {1, 3, 64}) {
    for (int r : {0, size / 2, size - 1}) {
      const Comm e = kvmap::Detail::emulated_comm(r, size);
      CHECK(e.rank() == r);
      CHECK(e.size() == size);
    }
  }
  CHECK_THROWS_AS(kvmap::Detail::emulated_comm(0, 0), kvmap::ValueError);
  CHECK_THROWS_AS(kvmap::Detail::emulated_comm(3, 3), kvmap::ValueError);
  CHECK_THROWS_AS(kvmap::Detail::emulated_comm(-1, 2), kvmap::ValueError);

  const Comm e = kvmap::Detail::emulated_comm(2, 5), f = kvmap::Detail::emulated_comm(2, 5);
  CHECK(e.id() != f.id());
  CHECK(e.id() != Comm::world().id());
  // There is no MPI communicator to call: raw() refuses, so no collective or message below
  // reaches MPI (only box_type, a static function, builds MPI datatypes).
  CHECK_THROWS_WITH_AS(e.raw(), doctest::Contains("emulated"), kvmap::Error);
  const kvmap::Stats before = kvmap::stats();
  e.barrier();
  // Gathers repeat this rank's contribution.
  const std::vector<int> all = kvmap::Detail::transport(e).allgather(42);
  CHECK(all == std::vector<int>(5, 42));
  const Bytes mine = bytes_of(2, 6, 9);
  Bytes gathered(6 * 5, 0);
  kvmap::Detail::transport(e).allgather_bytes(mine.data(), mine.size(), gathered.data());
  for (int r = 0; r < 5; ++r) {
    CHECK(Bytes(gathered.begin() + 6 * r, gathered.begin() + 6 * (r + 1)) == mine);
  }
  // Broadcasts and reductions leave this rank's values as they are.
  Bytes data = mine;
  kvmap::Detail::transport(e).bcast_bytes(data.data(), data.size(), 0);
  CHECK(data == mine);
  CHECK(kvmap::Detail::transport(e).bcast_string("mine", 2) == "mine");
  CHECK(kvmap::Detail::transport(e).bcast_string("mine", 0) ==
        "mine");  // root is taken to pass what this rank passes
  // allgatherv repeats this rank's block at every rank's displacement.
  Bytes gathered_v(40, 0xee);
  kvmap::Detail::transport(e).allgatherv_bytes(mine.data(), 6, gathered_v.data(), {6, 6, 6, 6, 6},
                                               {34, 0, 20, 7, 13});
  for (int at : {34, 0, 20, 7, 13}) {
    CHECK(Bytes(gathered_v.begin() + at, gathered_v.begin() + at + 6) == mine);
  }
  std::vector<double> values{1.5, -2.0, 3.0};
  kvmap::Detail::transport(e).allreduce_sum(values.data(), values.size(), DType::Float64);
  kvmap::Detail::transport(e).allreduce_max(values.data(), values.size(), DType::Float64);
  CHECK(values == std::vector<double>{1.5, -2.0, 3.0});
  CHECK(kvmap::Detail::transport(e).allreduce_sum(std::int64_t{5}) == 5);
  CHECK(kvmap::Detail::transport(e).allreduce_max(7.0) == 7.0);
  MinMaxSum rec{1, 2, 3};
  kvmap::Detail::transport(e).allreduce_bytes(&rec, sizeof rec, combine_min_max_sum);
  CHECK(rec.min == 1);
  CHECK(rec.max == 2);
  CHECK(rec.sum == 3);
  // Point-to-point messages are not sent: the receive buffer keeps its bytes.
  Detail::Messages x;
  x.send(0, 0, 6);
  x.send(4, 0, 6);
  x.recv(1, 0, 6);
  x.recv(3, 6, 6);
  Bytes recv(12, 0xee);
  kvmap::Detail::transport(e).run(x, mine.data(), recv.data());
  CHECK(recv == Bytes(12, 0xee));
  Detail::PeerTypes send_types(5), recv_types(5);
  send_types.set(1, Detail::box_type({6}, {1}, 1, 0));
  recv_types.set(3, Detail::box_type({6}, {1}, 1, 0));
  Bytes all_recv(6, 0xee);
  kvmap::Detail::transport(e).alltoallw(mine.data(), send_types, all_recv.data(), recv_types);
  CHECK(all_recv == Bytes(6, 0xee));
  // Nothing was counted as a collective or as received.
  const kvmap::Stats after = kvmap::stats();
  CHECK(after.collectives == before.collectives);
  CHECK(after.bytes_received == before.bytes_received);
}

TEST_CASE("comm: message_of gives an exception's message") {
  CHECK(kvmap::Detail::message_of(nullptr).empty());
  CHECK(kvmap::Detail::message_of(std::make_exception_ptr(std::runtime_error("went wrong"))) ==
        "went wrong");
  CHECK(kvmap::Detail::message_of(std::make_exception_ptr(kvmap::ValueError("bad value"))) ==
        "bad value");
  CHECK(kvmap::Detail::message_of(std::make_exception_ptr(17)).find("unknown exception") !=
        std::string::npos);
}
