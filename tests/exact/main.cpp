#define BOOST_TEST_MODULE exact
#include <boost/test/unit_test.hpp>
