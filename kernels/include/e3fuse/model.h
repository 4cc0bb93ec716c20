// e3fuse/model.h: a model loaded from an .e3f file (safetensors weights + JSON
// architecture). Immutable once loaded; shared by engines.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace e3fuse {

// Version of the .e3f format this build writes and reads. A file with a larger
// version is refused with a message asking for a newer e3fuse. Version 2 added blocks a
// version-1 reader would skip without a word (MACE pair_repulsion, radial transform and
// apply_cutoff, density layers, joint_embedding; SevenNet per-species self-connections).
// Version 3: a MACE skip connection may hold one map shared by all species (the
// non-linear block's), which a version-2 reader refuses as malformed.
constexpr int kModelFormatVersion = 3;

struct ModelPlan;  // the internal execution plan (src/model/plan.h)

class Model {
 public:
  // Throws Error on a missing, truncated, corrupt or too-new file.
  static std::shared_ptr<const Model> load(const std::string& path);
  static std::shared_ptr<const Model> from_bytes(const std::string& bytes,
                                                 const std::string& origin);
  ~Model();

  const std::string& family() const;  // "sevennet" | "mace"
  double cutoff() const;              // Angstrom
  int num_layers() const;
  int format_version() const;
  // atomic_numbers()[s] is the element of model species index s.
  const std::vector<int>& atomic_numbers() const;
  // Model species index of an atomic number, or -1 if the model lacks it.
  int species_of(int atomic_number) const;
  const std::string& architecture_json() const;  // the metadata as stored
  std::string summary() const;                   // human-readable description
  int64_t num_parameters() const;

  // Per-system inputs (mace's embedding_specs: total charge, spin; empty for most models):
  // mace's name, the ASE atoms.info key / pair_style keyword, and mace's default value.
  struct SystemInput {
    std::string name, key;
    double default_value = 0.0;
  };
  std::vector<SystemInput> system_inputs() const;
  // A model with per-system inputs is evaluated through a copy with their values folded
  // into the species embedding and reference energies: values[i] of system_inputs()[i].
  // Throws Error on a wrong count or a value outside a categorical input's classes.
  std::shared_ptr<const Model> with_system_inputs(const std::vector<double>& values) const;
  // Whether the plan still needs with_system_inputs() before it can be evaluated.
  bool needs_system_inputs() const;

  const ModelPlan& plan() const { return *plan_; }

 private:
  Model() = default;
  static std::shared_ptr<const Model> from_bytes_or_file(const std::string& origin,
                                                         const std::string* bytes);
  std::unique_ptr<ModelPlan> plan_;
};

}  // namespace e3fuse
