// The GPU check compiled as C++: the public header used from C++ (extern "C").
#include "main.c"
