// Boost.JSON's implementation, compiled once for every nsbox binary (header-only use: no
// libboost_json to ship or link statically).

#include <boost/json/src.hpp>
