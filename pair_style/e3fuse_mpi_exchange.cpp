/* e3fuse's own halo exchange for pair_style e3fuse, comm exchange: see
   e3fuse_mpi_exchange.h. */

#include "e3fuse_mpi_exchange.h"

#include <algorithm>
#include <stdexcept>
#include <string>

// Open MPI declares its CUDA query in mpi-ext.h (OMPI_HAVE_MPI_EXT_CUDA)
#if defined(OPEN_MPI) && OPEN_MPI && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

using namespace LAMMPS_NS;

namespace {
// message tags of the exchange (MPI guarantees tags up to 32767)
constexpr int kTagRequests = 0x3e30, kTagForward = 0x3e31, kTagReverse = 0x3e32;

// Rows of row_bytes as one contiguous datatype: a peer's rows travel as one message.
MPI_Datatype row_type(size_t row_bytes) {
  MPI_Datatype type;
  MPI_Type_contiguous(static_cast<int>(row_bytes), MPI_BYTE, &type);
  MPI_Type_commit(&type);
  return type;
}
}  // namespace

/* ---------------------------------------------------------------------- */

E3fuseMpiExchange::E3fuseMpiExchange(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &me_);
  MPI_Comm_size(comm_, &nprocs_);
}

void E3fuseMpiExchange::wait_all() {
  if (!requests_.empty())
    MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  requests_.clear();
}

/* ----------------------------------------------------------------------
   The lists of the exchange, from the owners of the ghost nodes:
   1. Ghost nodes owned by this rank are self images (the engine copies the
      owned row); of those owned by another rank, one per (rank, atom) is
      exchanged, its further images are self images of that one. Ghost nodes
      are reordered [exchanged, grouped by owner rank | self images].
   2. Each rank tells each owner which of its atoms it needs (counts by
      MPI_Alltoall, the local indices point-to-point): the send lists.
------------------------------------------------------------------------- */

std::vector<int> E3fuseMpiExchange::plan(int num_owned, const std::vector<int> &owned_node,
                                         const std::vector<Owner> &ghost_owners) {
  struct Remote {
    int rank, index, node;
  };
  std::vector<Remote> remote;
  std::vector<int> self_nodes, self_sources;  // self images of owned atoms
  for (size_t k = 0; k < ghost_owners.size(); ++k) {
    const Owner &o = ghost_owners[k];
    const int u = num_owned + static_cast<int>(k);
    if (o.rank == me_) {
      self_nodes.push_back(u);
      self_sources.push_back(owned_node[o.index]);
    } else {
      remote.push_back({o.rank, o.index, u});
    }
  }
  std::sort(remote.begin(), remote.end(), [](const Remote &a, const Remote &b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.index != b.index) return a.index < b.index;
    return a.node < b.node;
  });

  // the new order of the ghost nodes: exchanged, then self images
  std::vector<int> order;
  order.reserve(ghost_owners.size());
  std::vector<int> request_counts(nprocs_, 0);
  std::vector<int> asked;  // owner local indices of the exchanged ghosts, grouped by rank
  std::vector<int> duplicate_nodes, duplicate_sources;
  recv_peers_.clear();
  recv_offsets_.assign(1, 0);
  for (size_t k = 0; k < remote.size(); ++k) {
    const Remote &r = remote[k];
    if (k > 0 && r.rank == remote[k - 1].rank && r.index == remote[k - 1].index) {
      duplicate_nodes.push_back(r.node);  // another image of the last exchanged one
      duplicate_sources.push_back(num_owned + static_cast<int>(order.size()) - 1);
      continue;
    }
    if (recv_peers_.empty() || recv_peers_.back() != r.rank) {
      recv_peers_.push_back(r.rank);
      recv_offsets_.push_back(recv_offsets_.back());
    }
    ++recv_offsets_.back();
    ++request_counts[r.rank];
    asked.push_back(r.index);
    order.push_back(r.node);
  }
  image_sources_.clear();
  for (size_t k = 0; k < self_nodes.size(); ++k) {
    order.push_back(self_nodes[k]);
    image_sources_.push_back(self_sources[k]);
  }
  for (size_t k = 0; k < duplicate_nodes.size(); ++k) {
    order.push_back(duplicate_nodes[k]);
    image_sources_.push_back(duplicate_sources[k]);
  }

  // the owners learn what to send
  std::vector<int> send_counts(nprocs_, 0);
  MPI_Alltoall(request_counts.data(), 1, MPI_INT, send_counts.data(), 1, MPI_INT, comm_);
  send_peers_.clear();
  send_offsets_.assign(1, 0);
  for (int p = 0; p < nprocs_; ++p)
    if (send_counts[p] > 0) {
      if (p == me_) throw std::runtime_error("halo exchange lists name this rank itself");
      send_peers_.push_back(p);
      send_offsets_.push_back(send_offsets_.back() + send_counts[p]);
    }
  std::vector<int> wanted(send_offsets_.back());
  // the local indices each owner is asked for, as rows of one int along the forward rows'
  // paths reversed (not counted as halo traffic)
  send_and_receive(sizeof(int), reinterpret_cast<const char *>(asked.data()), recv_peers_,
                   recv_offsets_, reinterpret_cast<char *>(wanted.data()), send_peers_,
                   send_offsets_, kTagRequests);

  // border entries: the owned nodes each rank asked for, peer by peer
  const int num_atoms = static_cast<int>(owned_node.size());
  border_nodes_.resize(wanted.size());
  for (size_t k = 0; k < wanted.size(); ++k) {
    const int index = wanted[k];
    if (index < 0 || index >= num_atoms || owned_node[index] < 0)
      throw std::runtime_error("another rank asked for local atom " + std::to_string(index) +
                               ", not a node");
    border_nodes_[k] = owned_node[index];
  }
  return order;
}

/* Rows of `width` values of T (the engine's precision) travel as they are, one MPI message
   per peer and direction, of rows as a contiguous datatype. */

// Rows of row_bytes each: for every peer p of `to`, rows to_offsets[p] .. to_offsets[p + 1] of
// `send` go to rank to[p]; for every peer of `from`, its rows arrive into `recv` likewise.
void E3fuseMpiExchange::send_and_receive(size_t row_bytes, const char *send,
                                         const std::vector<int> &to,
                                         const std::vector<int> &to_offsets, char *recv,
                                         const std::vector<int> &from,
                                         const std::vector<int> &from_offsets, int tag) {
  MPI_Datatype row = row_type(row_bytes);
  for (size_t p = 0; p < from.size(); ++p) {
    requests_.emplace_back();
    MPI_Irecv(recv + from_offsets[p] * row_bytes, from_offsets[p + 1] - from_offsets[p], row,
              from[p], tag, comm_, &requests_.back());
  }
  // MPI's send buffers are const only since MPI 3
  char *out = const_cast<char *>(send);
  for (size_t p = 0; p < to.size(); ++p) {
    requests_.emplace_back();
    MPI_Isend(out + to_offsets[p] * row_bytes, to_offsets[p + 1] - to_offsets[p], row, to[p], tag,
              comm_, &requests_.back());
  }
  wait_all();
  MPI_Type_free(&row);
}

// send_and_receive of node rows, counted as the halo exchange's bytes and time.
void E3fuseMpiExchange::exchange_rows(size_t row_bytes, const char *send,
                                      const std::vector<int> &to,
                                      const std::vector<int> &to_offsets, char *recv,
                                      const std::vector<int> &from,
                                      const std::vector<int> &from_offsets, int tag) {
  const double start = MPI_Wtime();
  send_and_receive(row_bytes, send, to, to_offsets, recv, from, from_offsets, tag);
  bytes_sent_ += static_cast<double>(to_offsets.back()) * static_cast<double>(row_bytes);
  seconds_ += MPI_Wtime() - start;
}

// forward: the border entries go to the ranks that asked for them, the exchanged ghosts'
// rows come from their owners
template <class T>
void E3fuseMpiExchange::forward_rows(int width, const T *border_rows, T *ghost_rows) {
  exchange_rows(static_cast<size_t>(width) * sizeof(T), reinterpret_cast<const char *>(border_rows),
                send_peers_, send_offsets_, reinterpret_cast<char *>(ghost_rows), recv_peers_,
                recv_offsets_, kTagForward);
}

// reverse: the exchanged ghosts' adjoints go back to their owners, one sum per border entry
template <class T>
void E3fuseMpiExchange::reverse_rows(int width, const T *ghost_rows, T *border_sums) {
  exchange_rows(static_cast<size_t>(width) * sizeof(T), reinterpret_cast<const char *>(ghost_rows),
                recv_peers_, recv_offsets_, reinterpret_cast<char *>(border_sums), send_peers_,
                send_offsets_, kTagReverse);
}

/* The engine's side (e3fuse::HaloExchange). */

int64_t E3fuseMpiExchange::num_border_nodes() const {
  return static_cast<int64_t>(border_nodes_.size());
}

const int32_t *E3fuseMpiExchange::border_nodes() const {
  return border_nodes_.data();
}

int64_t E3fuseMpiExchange::num_self_images() const {
  return static_cast<int64_t>(image_sources_.size());
}

const int32_t *E3fuseMpiExchange::self_image_sources() const {
  return image_sources_.data();
}

void E3fuseMpiExchange::forward(int width, const double *border_rows, double *ghost_rows) {
  forward_rows(width, border_rows, ghost_rows);
}

void E3fuseMpiExchange::forward(int width, const float *border_rows, float *ghost_rows) {
  forward_rows(width, border_rows, ghost_rows);
}

void E3fuseMpiExchange::reverse(int width, const double *ghost_rows, double *border_sums) {
  reverse_rows(width, ghost_rows, border_sums);
}

void E3fuseMpiExchange::reverse(int width, const float *ghost_rows, float *border_sums) {
  reverse_rows(width, ghost_rows, border_sums);
}

bool E3fuseMpiExchange::mpi_supports_cuda() {
#if defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) != MPI_SUCCESS) return false;
  return supported != 0;
#elif defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

void E3fuseMpiExchange::add_device_wait(double seconds) {
  device_wait_ += seconds;
  device_reports_ = true;
}

void E3fuseMpiExchange::reset_counters() {
  seconds_ = bytes_sent_ = device_wait_ = 0.0;
  device_reports_ = false;
}
