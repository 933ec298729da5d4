/* The real executables: starts `ina-agent --model tiny --device cpu` (path in argv[1]),
 * waits for it to print its address and "serving", runs `ina health`, `ina info` and
 * `ina generate --server` against it (path of `ina` in argv[2]), compares the streamed
 * tokens with a local `ina generate` of the same prompt, then sends SIGTERM and expects
 * exit status 0. First, an option with a bad value (--index-keys e5m2) must exit 2. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/test_util.h"

/* fork/exec with stdout to a pipe; returns the pid, *out_fd the pipe's read end. */
static pid_t spawn(char *const argv[], int *out_fd) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  *out_fd = fds[0];
  return pid;
}

/* Reads from fd into buf (appending) until `needle` appears, EOF or the deadline. */
static int read_until(int fd, char *buf, size_t cap, size_t *len, const char *needle, double deadline) {
  while (!strstr(buf, needle)) {
    int left_ms = (int)((deadline - test_now_s()) * 1000);
    if (left_ms <= 0) return 0;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, left_ms) <= 0) continue;
    ssize_t n = read(fd, buf + *len, cap - 1 - *len);
    if (n <= 0) return 0;
    *len += (size_t)n;
    buf[*len] = '\0';
  }
  return 1;
}

/* Waits for pid with a deadline; returns the wait status, or -1 on timeout (then kills). */
static int wait_exit(pid_t pid, double timeout_s) {
  double end = test_now_s() + timeout_s;
  int status = 0;
  while (test_now_s() < end) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

/* Runs a command to its end, its stdout into buf; returns the exit code (-1: abnormal). */
static int run(char *const argv[], char *buf, size_t cap) {
  int fd = -1;
  size_t len = 0;
  buf[0] = '\0';
  pid_t pid = spawn(argv, &fd);
  if (pid < 0) return -1;
  read_until(fd, buf, cap, &len, "\x01never", test_now_s() + 120);
  close(fd);
  int status = wait_exit(pid, 120);
  return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The "prompt 0: ..." line of `ina generate` output, copied into line. */
static int prompt_line(const char *out, char *line, size_t cap) {
  const char *p = strstr(out, "prompt 0:");
  if (!p) return 0;
  size_t n = strcspn(p, "\n");
  if (n >= cap) return 0;
  memcpy(line, p, n);
  line[n] = '\0';
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: test_agent_exec PATH/ina-agent PATH/ina\n");
    return 2;
  }
  test_rng_t rng = {test_seed("test_agent_exec")};
  char *agent_path = argv[1], *ina_path = argv[2];
  char model_seed[32], prompt[256], max_new[16];
  snprintf(model_seed, sizeof model_seed, "%llu", (unsigned long long)(test_rng_next(&rng) >> 1));
  int n = (int)test_rng_int(&rng, 1, 24), off = 0;
  for (int i = 0; i < n; i++)
    off += snprintf(prompt + off, sizeof prompt - (size_t)off, "%s%d", i ? "," : "", (int)test_rng_int(&rng, 0, 1023));
  snprintf(max_new, sizeof max_new, "%d", (int)test_rng_int(&rng, 1, 16));

  {
    /* an option with a bad value is refused before anything starts: exit 2 */
    char *bad_keys[] = {agent_path, "--model", "tiny", "--index-keys", "e5m2", NULL};
    char out[256];
    CHECK(run(bad_keys, out, sizeof out) == 2);
  }

  char *agent_argv[] = {agent_path, "--model", "tiny", "--model-seed", model_seed, "--device", "cpu",
                        "--listen", "127.0.0.1:0", "--threads", "2", "--max-tokens", "4096", NULL};
  int agent_fd = -1;
  static char agent_out[8192];
  size_t agent_len = 0;
  pid_t agent = spawn(agent_argv, &agent_fd);
  CHECK(agent > 0);
  if (agent <= 0) return test_finish("test_agent_exec");
  int up = read_until(agent_fd, agent_out, sizeof agent_out, &agent_len, "serving\n", test_now_s() + 120);
  CHECKF(up, "ina-agent did not say serving; output: %s", agent_out);
  char address[128] = "";
  const char *at = strstr(agent_out, "listening on ");
  CHECK(at && sscanf(at, "listening on %127s", address) == 1);
  printf("ina-agent at %s, prompt %s, %s new tokens\n", address, prompt, max_new);

  if (up && address[0]) {
    static char out[16384], local[16384];
    char remote_line[4096], local_line[4096];
    char *health_argv[] = {ina_path, "health", "--server", address, NULL};
    CHECK(run(health_argv, out, sizeof out) == 0 && strstr(out, "health: SERVING"));
    char *info_argv[] = {ina_path, "info", "--server", address, NULL};
    CHECK(run(info_argv, out, sizeof out) == 0 && strstr(out, "device: cpu") && strstr(out, "model: tiny"));
    char *remote_argv[] = {ina_path, "generate", "--server", address, "--prompt-ids", prompt,
                           "--max-new-tokens", max_new, "--ignore-eos", NULL};
    CHECK(run(remote_argv, out, sizeof out) == 0);
    char *local_argv[] = {ina_path, "generate", "--model", "tiny", "--model-seed", model_seed, "--device",
                          "cpu", "--threads", "2", "--prompt-ids", prompt, "--max-new-tokens", max_new,
                          "--ignore-eos", NULL};
    CHECK(run(local_argv, local, sizeof local) == 0);
    CHECK(prompt_line(out, remote_line, sizeof remote_line) && prompt_line(local, local_line, sizeof local_line));
    CHECKF(strcmp(remote_line, local_line) == 0, "remote '%s' vs local '%s'", remote_line, local_line);
    CHECK(strstr(out, "finish: length") != NULL);
    /* A bad request: the client reports INVALID_ARGUMENT and fails. */
    char *bad_argv[] = {ina_path, "generate", "--server", address, "--prompt-ids", "1,2,99999", NULL};
    CHECK(run(bad_argv, out, sizeof out) == 1);
  }

  CHECK(kill(agent, SIGTERM) == 0);
  read_until(agent_fd, agent_out, sizeof agent_out, &agent_len, "stopped\n", test_now_s() + 60);
  int status = wait_exit(agent, 60);
  CHECKF(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "ina-agent wait status %d", status);
  CHECK(strstr(agent_out, "ina-agent: stopped") != NULL);
  close(agent_fd);
  return test_finish("test_agent_exec");
}
