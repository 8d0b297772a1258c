#include <gtest/gtest.h>
TEST(ChatTemplateOracle, Placeholder) {}
