// The model: a character-level language model after Bengio et al. (2003).
// Each of `context` previous bytes is embedded (vocab x embed), the
// embeddings are concatenated, go through one tanh layer (hidden units) and
// a softmax over the vocabulary predicts the next byte. All parameters live
// in one flat float vector so that one all-reduce carries every gradient and
// a checkpoint is a handful of views of it; the maths is Eigen's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <Eigen/Core>

namespace trainer {

struct Shape {
  int vocab = 0;
  int context = 16;
  int embed = 16;
  int hidden = 128;
};

// One named tensor of the flat vector (row-major, as safetensors stores it).
struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in floats
  size_t count = 0;
};

class Model {
 public:
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  explicit Model(const Shape& shape);

  const Shape& shape() const { return shape_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  size_t parameter_count() const { return params_.size(); }
  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }

  // Parameters drawn from `seed` alone: embeddings and weights uniform in
  // +-1/sqrt(fan-in) (embeddings +-1), biases zero.
  void init(uint64_t seed);

  // Mean cross-entropy (nats) of predicting targets[b] from the `context`
  // tokens at inputs[b * context]; keeps what backward() needs.
  float forward(const int32_t* inputs, const int32_t* targets, int batch);

  // Gradient of the last forward()'s loss into grad[0, parameter_count()).
  void backward(float* grad);

 private:
  Shape shape_;
  std::vector<TensorView> tensors_;
  std::vector<float> params_;
  // The last forward's batch and activations.
  const int32_t* inputs_ = nullptr;
  const int32_t* targets_ = nullptr;
  Matrix x_, a_, p_;
};

// Adam (Kingma and Ba) over the flat vector; its moments are checkpointed.
class Adam {
 public:
  Adam(size_t n, float lr) : m_(n, 0.0f), v_(n, 0.0f), lr_(lr) {}
  // Applies the averaged gradient of step `t` (counted from 1).
  void step(std::vector<float>& params, const float* grad, uint64_t t);
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }

 private:
  std::vector<float> m_, v_;
  float lr_;
};

}  // namespace trainer
