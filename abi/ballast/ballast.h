/* Ballast C ABI: everything, for convenience. */
#ifndef BALLAST_H
#define BALLAST_H
#include "comm.h"
#include "command.h"
#include "event.h"
#include "events.h"
#include "host.h"
#include "plugin.h"
#include "scheduler.h"
#include "startup.h"
#include "status.h"
#include "trace.h"
#endif
