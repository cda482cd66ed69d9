/* The bandwidth floor under uroce's `udp` backend on loopback: one process
 * streams UDP GSO sends of 4128-byte datagrams (a 4096-byte RoCE payload
 * with BTH, RETH and ICRC) from 127.0.0.2 to a UDP_GRO socket on
 * 127.0.0.1, and, for comparison, the same bytes over one TCP connection.
 * Each path copies every byte once into the kernel and once out; uroce's
 * RDMA WRITE cannot carry more through the same sockets. Built and run by
 * scripts/bw-floor. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum { SEG = 4128, SEGS = 15, CHUNK = 1 << 20 };

static double seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void big_buffers(int fd)
{
	int size = 8 << 20;
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size))
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size))
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

/* One GSO send of SEGS datagrams of SEG bytes. */
static ssize_t send_run(int fd, char *data)
{
	char control[CMSG_SPACE(sizeof(unsigned short))] = { 0 };
	struct iovec iov = { data, SEG * SEGS };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
			      .msg_control = control, .msg_controllen = sizeof control };
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	unsigned short seg = SEG;

	c->cmsg_level = IPPROTO_UDP;
	c->cmsg_type = UDP_SEGMENT;
	c->cmsg_len = CMSG_LEN(sizeof seg);
	memcpy(CMSG_DATA(c), &seg, sizeof seg);
	return sendmsg(fd, &msg, 0);
}

static double run(int tcp, long total)
{
	struct sockaddr_in server = { .sin_family = AF_INET };
	struct sockaddr_in client = { .sin_family = AF_INET };
	socklen_t len = sizeof server;
	char *buf = malloc(CHUNK);
	int one = 1, rx, fd;
	long got = 0;
	double start = 0;
	pid_t pid;

	memset(buf, 0x5a, CHUNK);
	server.sin_addr.s_addr = inet_addr("127.0.0.1");
	client.sin_addr.s_addr = inet_addr("127.0.0.2");
	rx = socket(AF_INET, tcp ? SOCK_STREAM : SOCK_DGRAM, 0);
	big_buffers(rx);
	if (rx < 0 || bind(rx, (void *)&server, sizeof server) ||
	    getsockname(rx, (void *)&server, &len))
		return -1;
	if (tcp ? listen(rx, 1) : setsockopt(rx, IPPROTO_UDP, UDP_GRO, &one, sizeof one))
		return -1;
	pid = fork();
	if (pid == 0) {
		long sent = 0;
		fd = socket(AF_INET, tcp ? SOCK_STREAM : SOCK_DGRAM, 0);
		big_buffers(fd);
		if (bind(fd, (void *)&client, sizeof client) ||
		    connect(fd, (void *)&server, sizeof server))
			_exit(1);
		while (sent < total) {
			ssize_t k = tcp ? send(fd, buf, CHUNK, 0) : send_run(fd, buf);
			if (k > 0)
				sent += k;
		}
		/* The end mark: a one-byte datagram (resent: UDP may drop). */
		for (int i = 0; !tcp && i < 100; i++, usleep(1000))
			send(fd, "", 1, 0);
		close(fd);
		_exit(0);
	}
	fd = tcp ? accept(rx, NULL, NULL) : rx;
	for (;;) {
		ssize_t k = recv(fd, buf, CHUNK, 0);
		if (start == 0)
			start = seconds();
		if (k <= 0 || (!tcp && k == 1))
			break;
		got += k;
	}
	waitpid(pid, NULL, 0);
	close(fd);
	if (fd != rx)
		close(rx);
	free(buf);
	return got / (seconds() - start) / 1e9;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 3;
	long total = 4L << 30;

	for (int i = 0; i < rounds; i++) {
		double udp = run(0, total), tcp = run(1, total);
		printf("udp gso (4128-byte datagrams) %.2f GB/s   tcp %.2f GB/s\n", udp, tcp);
	}
	return 0;
}
