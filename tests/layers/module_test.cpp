// Module: registration, names, state_dict round trip, train/eval, to(device).
#include <gtest/gtest.h>

#include <memory>

#include "engine/error.h"
#include "layers/activation.h"
#include "layers/linear.h"

using namespace kiln;

static std::shared_ptr<Sequential> small_net() {
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Linear>(4, 3));
  net->push_back(std::make_shared<ReLU>());
  net->push_back(std::make_shared<Linear>(3, 2));
  return net;
}

TEST(Module, NamesParametersInOrder) {
  auto net = small_net();
  auto named = net->named_parameters();
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named[0].first, "0.weight");
  EXPECT_EQ(named[1].first, "0.bias");
  EXPECT_EQ(named[3].first, "2.bias");
  EXPECT_TRUE(named[0].second.requires_grad());
  EXPECT_EQ(net->num_parameters(), 4 * 3 + 3 + 3 * 2 + 2);
}

TEST(Module, StateDictRoundTrip) {
  auto a = small_net(), b = small_net();
  b->load_state_dict(a->state_dict());
  Tensor x = Tensor::ones({1, 4});
  EXPECT_EQ(a->forward(x).to_vector<float>(), b->forward(x).to_vector<float>());
  auto sd = a->state_dict();
  sd.erase("0.bias");
  EXPECT_THROW(b->load_state_dict(sd), Error);
  auto bad = a->state_dict();
  bad["0.bias"] = Tensor::zeros({7});
  EXPECT_THROW(b->load_state_dict(bad), Error);
}

TEST(Module, TrainEvalPropagates) {
  auto net = small_net();
  net->eval();
  EXPECT_FALSE(net->at(0)->is_training());
  net->train();
  EXPECT_TRUE(net->at(2)->is_training());
}

TEST(Module, ToDeviceKeepsParameterIdentity) {
  auto net = small_net();
  Tensor w = net->parameters()[0];
  net->to(Device("cpu:1"));
  EXPECT_EQ(w.device(), Device("cpu:1"));  // the same handle moved
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(net->forward(Tensor::ones({2, 4}).to("cpu:1")).device(), Device("cpu:1"));
  EXPECT_THROW(net->forward(Tensor::ones({2, 4})), Error);  // input on the wrong device
}
