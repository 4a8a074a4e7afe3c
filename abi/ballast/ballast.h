/* Ballast C ABI: everything, for convenience. */
#ifndef BALLAST_H
#define BALLAST_H
#include "status.h"
#include "event.h"
#include "events.h"
#include "plugin.h"
#include "command.h"
#include "host.h"
#include "comm.h"
#include "trace.h"
#include "scheduler.h"
#include "startup.h"
#endif
