// Boost.Beast's implementation, compiled once for every nsbox binary
// (BOOST_BEAST_SEPARATE_COMPILATION, set for every user in cmake/Dependencies.cmake): each file
// that uses Beast no longer compiles it again.

#include <boost/beast/src.hpp>
