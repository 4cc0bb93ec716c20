/* e3fuse's own halo exchange for pair_style e3fuse, comm exchange: the engine's
   e3fuse::HaloExchange over MPI point-to-point messages, independent of LAMMPS's
   objects (the pair style finds the owners, this class the rest).

   At every reneighboring the pair style hands plan() the owner (rank, local index
   there) of every ghost node. Ghosts owned by this rank are self images: periodic
   images of its own atoms, whose rows the engine copies on its device from the
   owned node (and whose adjoints it adds back there). Of the ghosts owned by other
   ranks, one per (rank, atom) is exchanged; its further images are self images of
   that one. plan() reorders the ghost nodes [exchanged, grouped by owner rank |
   self images] and tells every owner which of its atoms it needs: the per-peer
   receive lists (ours) and send lists (the border nodes other ranks asked for, in
   their order; a node may be sent to several ranks).

   After each interaction layer the engine calls forward(): each border entry's row
   goes to the rank that asked for it, each exchanged ghost's row comes from its
   owner; in the force pass reverse() sends the exchanged ghosts' adjoints back, one
   sum per border entry, which the engine adds to its nodes. Rows are `width` values
   in the model's precision (float for float32), sent as they are: one message per
   peer and direction. */

#ifndef LMP_E3FUSE_MPI_EXCHANGE_H
#define LMP_E3FUSE_MPI_EXCHANGE_H

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "e3fuse/engine.h"

namespace LAMMPS_NS {

class E3fuseMpiExchange : public e3fuse::HaloExchange {
 public:
  // Where an atom lives: an MPI rank and its local index there.
  struct Owner {
    int rank, index;
  };

  explicit E3fuseMpiExchange(MPI_Comm comm);

  // Collective (every rank, at the same reneighboring): chooses the exchange for a new set
  // of nodes, num_owned owned ones followed by the ghosts. owned_node: this rank's local
  // atom index -> its node (< num_owned) or -1. ghost_owners[k]: the owner of node
  // num_owned + k; one that is this rank must name an atom that is a node (the caller
  // checks the owners, which it can name by atom ID). Returns the new order of the ghost
  // nodes: new node num_owned + k is old node order[k]. Throws std::runtime_error when
  // the ranks' lists disagree.
  std::vector<int> plan(int num_owned, const std::vector<int> &owned_node,
                        const std::vector<Owner> &ghost_owners);

  // e3fuse::HaloExchange
  int64_t num_border_nodes() const override;
  const int32_t *border_nodes() const override;
  int64_t num_self_images() const override;
  const int32_t *self_image_sources() const override;
  void forward(int width, const double *border_rows, double *ghost_rows) override;
  void forward(int width, const float *border_rows, float *ghost_rows) override;
  void reverse(int width, const double *ghost_rows, double *border_sums) override;
  void reverse(int width, const float *ghost_rows, float *border_sums) override;
  void add_device_wait(double seconds) override;
  bool takes_device_rows() const override { return device_rows_; }

  // Whether this MPI library reads and writes GPU memory itself (CUDA-aware), asked at run
  // time: MPICH >= 4 MPIX_GPU_query_support, Open MPI MPIX_Query_cuda_support (mpi-ext.h);
  // false for other libraries or when neither is declared.
  static bool mpi_supports_cuda();
  // Rows in GPU memory (a GPU engine and a CUDA-aware MPI library) or in host memory.
  void set_device_rows(bool on) { device_rows_ = on; }

  // seconds spent in forward() and reverse() (the exchange's wall time), and bytes of rows
  // this rank sent to other ranks (self images never leave the engine), since
  // reset_counters()
  void reset_counters();
  double seconds() const { return seconds_; }
  double bytes_sent() const { return bytes_sent_; }
  // Of a GPU engine (add_device_wait): the seconds its device waited for the exchange (the
  // part its convolution did not cover); device_reports() false: no report (CPU engine: the
  // computation waits for the whole exchange).
  double device_wait() const { return device_wait_; }
  bool device_reports() const { return device_reports_; }

 private:
  template <class T> void forward_rows(int width, const T *border_rows, T *ghost_rows);
  template <class T> void reverse_rows(int width, const T *ghost_rows, T *border_sums);
  void send_and_receive(size_t row_bytes, const char *send, const std::vector<int> &to,
                        const std::vector<int> &to_offsets, char *recv,
                        const std::vector<int> &from, const std::vector<int> &from_offsets,
                        int tag);
  void exchange_rows(size_t row_bytes, const char *send, const std::vector<int> &to,
                     const std::vector<int> &to_offsets, char *recv, const std::vector<int> &from,
                     const std::vector<int> &from_offsets, int tag);
  void wait_all();

  MPI_Comm comm_;
  int me_ = 0, nprocs_ = 1;
  // the exchanged ghosts, grouped by owner rank: rows recv_offsets_[p] .. recv_offsets_[p + 1]
  // of the exchanged block come from rank recv_peers_[p]
  std::vector<int> recv_peers_, recv_offsets_;
  // border entries send_offsets_[p] .. send_offsets_[p + 1] are the owned nodes rank
  // send_peers_[p] asked for, in its order: each peer's rows are sent from, and its
  // adjoints received into, the engine's border rows in place
  std::vector<int32_t> border_nodes_;
  std::vector<int> send_peers_, send_offsets_;
  std::vector<int32_t> image_sources_;  // per self image: the node it copies
  std::vector<MPI_Request> requests_;
  double seconds_ = 0.0, bytes_sent_ = 0.0, device_wait_ = 0.0;
  bool device_reports_ = false, device_rows_ = false;
};

}  // namespace LAMMPS_NS

#endif
