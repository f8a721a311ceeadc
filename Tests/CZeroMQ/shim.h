#ifndef SKYROS_CZEROMQ_SHIM_H
#define SKYROS_CZEROMQ_SHIM_H
#include <zmq.h>
#endif
