#define BOOST_TEST_MODULE server
#include <boost/test/unit_test.hpp>
