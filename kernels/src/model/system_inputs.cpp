// model/system_inputs.cpp: per-system inputs of MACE models (mace's embedding_specs,
// GenericJointEmbedding in mace/modules/embeddings.py): their embedding v is the same
// for every atom of a system, so a model copy with v added to the species embedding
// and the embedding readout's energy added to e0 evaluates them exactly.
#include "model/system_inputs.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "e3fuse/error.h"
#include "e3fuse/model.h"

namespace e3fuse {

namespace {

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// emb(q) of one input: a table row (torch: (q + offset).long(), which truncates toward
// zero) or Linear(1, dim) - SiLU - Linear(dim, dim).
std::vector<double> embed_input(const SystemInputPlan& in, double q) {
  std::vector<double> e(static_cast<size_t>(in.dim), 0.0);
  if (in.categorical) {
    const double shifted = std::trunc(q + in.offset);
    if (!std::isfinite(q) || shifted < 0 || shifted >= in.num_classes) {
      char range[96];
      std::snprintf(range, sizeof range, "%g .. %g", -in.offset, in.num_classes - 1 - in.offset);
      throw Error("system input " + in.name + " = " + std::to_string(q) +
                  " is outside the model's classes (" + range + ")");
    }
    const auto row = static_cast<size_t>(shifted);
    for (int d = 0; d < in.dim; ++d) e[d] = in.table[row * in.dim + d];
    return e;
  }
  if (!std::isfinite(q)) throw Error("system input " + in.name + " is not finite");
  std::vector<double> h(static_cast<size_t>(in.dim));
  for (int d = 0; d < in.dim; ++d) h[d] = silu(q * in.w1[d] + in.b1[d]);
  for (int d = 0; d < in.dim; ++d) {
    double acc = in.b2[d];
    for (int k = 0; k < in.dim; ++k) acc += h[k] * in.w2[k * in.dim + d];
    e[d] = acc;
  }
  return e;
}

// out = lin(x) for a linear layer on scalars only (the embedding readout).
double scalar_linear(const LinearPlan& lin, const double* x) {
  double out = 0.0;
  for (const LinearPath& p : lin.paths) {
    const IrrepBlock& bi = lin.in.blocks[p.in_block];
    const IrrepBlock& bo = lin.out.blocks[p.out_block];
    for (int u = 0; u < bi.mul; ++u)
      for (int w = 0; w < bo.mul; ++w) out += p.weight[u * bo.mul + w] * x[bi.offset + u];
  }
  for (const LinearBias& b : lin.biases)
    for (double v : b.bias) out += v;
  return out;
}

}  // namespace

std::vector<Model::SystemInput> Model::system_inputs() const {
  std::vector<SystemInput> out;
  for (const SystemInputPlan& in : plan_->joint_embedding.inputs)
    out.push_back({in.name, in.key, in.default_value});
  return out;
}

bool Model::needs_system_inputs() const {
  return !plan_->joint_embedding.inputs.empty() && !plan_->joint_embedding.folded;
}

SystemInputFold fold_system_inputs(const ModelPlan& plan, const std::vector<double>& values) {
  const JointEmbeddingPlan& je = plan.joint_embedding;
  if (je.inputs.empty()) throw Error("the model has no per-system inputs");
  if (values.size() != je.inputs.size())
    throw Error("the model has " + std::to_string(je.inputs.size()) + " per-system inputs, got " +
                std::to_string(values.size()) + " values");
  // v = silu(projection^T [emb_1 | emb_2 | ...])  (GenericJointEmbedding.project)
  std::vector<double> concat;
  for (size_t i = 0; i < je.inputs.size(); ++i) {
    const std::vector<double> e = embed_input(je.inputs[i], values[i]);
    concat.insert(concat.end(), e.begin(), e.end());
  }
  const int dim = plan.embedding_dim;
  std::vector<double> v(static_cast<size_t>(dim));
  for (int d = 0; d < dim; ++d) {
    double acc = 0.0;
    for (size_t k = 0; k < concat.size(); ++k) acc += concat[k] * je.projection[k * dim + d];
    v[d] = silu(acc);
  }
  SystemInputFold fold;
  fold.embedding = je.folded ? je.base_embedding : plan.embedding;
  fold.e0 = je.folded ? je.base_e0 : plan.e0;
  const size_t num_species = plan.atomic_numbers.size();
  for (size_t s = 0; s < num_species; ++s) {
    double* row = &fold.embedding[s * dim];
    for (int d = 0; d < dim; ++d) row[d] += v[d];
    // MACE.forward: e0 += embedding_readout(node_feats), unscaled, once per atom
    if (je.has_readout) fold.e0[s] += scalar_linear(je.readout, row);
  }
  return fold;
}

std::shared_ptr<const Model> Model::with_system_inputs(const std::vector<double>& values) const {
  if (plan_->joint_embedding.folded) throw Error("the model's per-system inputs are already set");
  SystemInputFold fold = fold_system_inputs(*plan_, values);
  auto plan = std::make_unique<ModelPlan>(*plan_);
  plan->joint_embedding.base_embedding = std::move(plan->embedding);
  plan->joint_embedding.base_e0 = std::move(plan->e0);
  plan->embedding = std::move(fold.embedding);
  plan->e0 = std::move(fold.e0);
  plan->joint_embedding.folded = true;
  plan->joint_embedding.values = values;
  std::shared_ptr<Model> model(new Model());
  model->plan_ = std::move(plan);
  return model;
}

}  // namespace e3fuse
