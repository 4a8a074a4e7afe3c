/* embed: a C program that hosts Ballast itself, without a config file.
 *
 * It creates a host, loads the example plugin and a policy, subscribes to
 * recovery.action and hello.seen, publishes a confirmed fault as a trainer
 * would, waits for the policy's answer, and stops.
 *
 *   embed PLUGIN.so POLICY.lua
 * Exit code 0 when the policy answered with a recovery action. */
#include <ballast/host.h>

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int actions;
static atomic_int seen;

static int on_action(void* user, const ballast_event* ev) {
  const ballast_recovery_action* a = (const ballast_recovery_action*)ev->payload;
  (void)user;
  if (ev->schema != BALLAST_SCHEMA_RECOVERY_ACTION || a == NULL) return BALLAST_EINVAL;
  printf("recovery.action: %s %s (%s)\n", a->action, a->subject ? a->subject : "(job)", a->reason ? a->reason : "");
  atomic_fetch_add(&actions, 1);
  return BALLAST_OK;
}

static int on_seen(void* user, const ballast_event* ev) {
  char json[512];
  (void)user;
  if (ballast_event_to_json(ev, json, sizeof json) >= 0) printf("hello.seen: %s\n", json);
  atomic_fetch_add(&seen, 1);
  return BALLAST_OK;
}

static int check(int rc, const char* what) {
  if (rc != BALLAST_OK)
    fprintf(stderr, "embed: %s failed: %s (%s)\n", what, ballast_last_error(), ballast_status_name(rc));
  return rc;
}

int main(int argc, char** argv) {
  ballast_host* host = NULL;
  ballast_subscribe_options queued;
  ballast_fault_report report;
  ballast_event ev;
  uint64_t id;
  int i;
  if (argc != 3) {
    fprintf(stderr, "usage: embed PLUGIN.so POLICY.lua\n");
    return 2;
  }
  if (check(ballast_host_create("embed-node", &host), "ballast_host_create")) return 1;
  if (check(ballast_host_load_plugin(host, argv[1], "{ greeting = 'hi from C' }"), "load_plugin") ||
      check(ballast_host_load_policy(host, argv[2], "escalate"), "load_policy")) {
    ballast_host_destroy(host);
    return 1;
  }
  memset(&queued, 0, sizeof queued);
  queued.size = sizeof queued;
  queued.delivery = BALLAST_DELIVER_QUEUED;
  check(ballast_host_subscribe(host, "recovery.action", &queued, on_action, NULL, &id), "subscribe");
  check(ballast_host_subscribe(host, "hello.seen", NULL, on_seen, NULL, &id), "subscribe");
  if (check(ballast_host_start(host), "start")) {
    ballast_host_destroy(host);
    return 1;
  }

  /* What a detector would publish: node gpu042 confirmed faulty. */
  memset(&report, 0, sizeof report);
  report.size = sizeof report;
  report.stage = BALLAST_FAULT_CONFIRMED;
  report.subject = "gpu042";
  report.rank = -1;
  report.kind = "xid";
  report.confidence = 0.99;
  report.evidence = "{\"xid\":79}";
  report.detector = "embed-example";
  memset(&ev, 0, sizeof ev);
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_FAULT_REPORT;
  ev.topic = "fault.confirmed";
  ev.source.rank = -1;
  ev.payload = &report;
  ev.payload_size = sizeof report;
  check(ballast_host_publish(host, &ev), "publish fault.confirmed");
  /* And a suspicion, which the hello plugin answers. */
  check(ballast_host_publish_json(host, "fault.suspected",
                                  "{\"stage\":0,\"subject\":\"gpu007\",\"kind\":\"outlier\",\"score\":4.2}"),
        "publish_json fault.suspected");

  for (i = 0; i < 500 && atomic_load(&actions) == 0; ++i) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  ballast_host_stop(host);
  ballast_host_destroy(host);
  printf("embed: %d action(s), %d hello.seen\n", atomic_load(&actions), atomic_load(&seen));
  return atomic_load(&actions) > 0 && atomic_load(&seen) > 0 ? 0 : 1;
}
