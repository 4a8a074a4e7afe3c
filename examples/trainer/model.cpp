#include "model.hpp"

#include <cmath>
#include <random>

namespace trainer {

namespace {

using Matrix = Model::Matrix;
using MatrixMap = Eigen::Map<Matrix>;
using RowMap = Eigen::Map<Eigen::RowVectorXf>;

}  // namespace

Model::Model(const Shape& s) : shape_(s) {
  const int64_t v = s.vocab, c = s.context, e = s.embed, h = s.hidden;
  size_t offset = 0;
  auto add = [&](const char* name, std::vector<int64_t> shape) {
    size_t count = 1;
    for (int64_t d : shape) count *= size_t(d);
    tensors_.push_back({name, std::move(shape), offset, count});
    offset += count;
  };
  add("embedding", {v, e});
  add("hidden.weight", {c * e, h});
  add("hidden.bias", {h});
  add("output.weight", {h, v});
  add("output.bias", {v});
  params_.assign(offset, 0.0f);
}

void Model::init(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float fan_in[] = {1.0f, float(shape_.context * shape_.embed), 0.0f, float(shape_.hidden), 0.0f};
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const float limit = fan_in[t] > 0 ? 1.0f / std::sqrt(fan_in[t]) : 0.0f;
    for (size_t i = 0; i < tensors_[t].count; ++i) {
      const float u = float(rng() >> 40) * (1.0f / 16777216.0f);  // 24 bits: exact in a float
      params_[tensors_[t].offset + i] = limit * (2.0f * u - 1.0f);
    }
  }
}

float Model::forward(const int32_t* inputs, const int32_t* targets, int batch) {
  const int c = shape_.context, e = shape_.embed, h = shape_.hidden, v = shape_.vocab;
  float* p = params_.data();
  const MatrixMap emb(p + tensors_[0].offset, v, e), w1(p + tensors_[1].offset, c * e, h),
      w2(p + tensors_[3].offset, h, v);
  const RowMap b1(p + tensors_[2].offset, h), b2(p + tensors_[4].offset, v);
  inputs_ = inputs;
  targets_ = targets;
  x_.resize(batch, c * e);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < c; ++j) x_.row(b).segment(j * e, e) = emb.row(inputs[b * c + j]);
  a_.noalias() = x_ * w1;
  a_.rowwise() += b1;
  a_ = a_.array().tanh();
  p_.noalias() = a_ * w2;
  p_.rowwise() += b2;
  double loss = 0;
  for (int b = 0; b < batch; ++b) {
    auto row = p_.row(b);
    row.array() -= row.maxCoeff();
    row = row.array().exp();
    const float sum = row.sum();
    row /= sum;
    loss -= std::log(double(row(targets[b])));
  }
  return float(loss / batch);
}

void Model::backward(float* grad) {
  const int c = shape_.context, e = shape_.embed, h = shape_.hidden, v = shape_.vocab;
  const int batch = int(p_.rows());
  const float* p = params_.data();
  const Eigen::Map<const Matrix> w1(p + tensors_[1].offset, c * e, h), w2(p + tensors_[3].offset, h, v);
  MatrixMap g_emb(grad + tensors_[0].offset, v, e), g_w1(grad + tensors_[1].offset, c * e, h),
      g_w2(grad + tensors_[3].offset, h, v);
  RowMap g_b1(grad + tensors_[2].offset, h), g_b2(grad + tensors_[4].offset, v);

  Matrix d = p_;  // d loss / d logits
  for (int b = 0; b < batch; ++b) d(b, targets_[b]) -= 1.0f;
  d *= 1.0f / float(batch);
  g_w2.noalias() = a_.transpose() * d;
  g_b2 = d.colwise().sum();
  Matrix dz = (d * w2.transpose()).array() * (1.0f - a_.array().square());
  g_w1.noalias() = x_.transpose() * dz;
  g_b1 = dz.colwise().sum();
  const Matrix dx = dz * w1.transpose();
  g_emb.setZero();
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < c; ++j) g_emb.row(inputs_[b * c + j]) += dx.row(b).segment(j * e, e);
}

void Adam::step(std::vector<float>& params, const float* grad, uint64_t t) {
  constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;
  const float c1 = float(1.0 - std::pow(double(kBeta1), double(t)));
  const float c2 = float(1.0 - std::pow(double(kBeta2), double(t)));
  const size_t n = params.size();
  Eigen::Map<Eigen::ArrayXf> p(params.data(), Eigen::Index(n)), m(m_.data(), Eigen::Index(n)),
      v(v_.data(), Eigen::Index(n));
  const Eigen::Map<const Eigen::ArrayXf> g(grad, Eigen::Index(n));
  m = kBeta1 * m + (1.0f - kBeta1) * g;
  v = kBeta2 * v + (1.0f - kBeta2) * g.square();
  p -= lr_ * (m / c1) / ((v / c2).sqrt() + kEps);
}

}  // namespace trainer
