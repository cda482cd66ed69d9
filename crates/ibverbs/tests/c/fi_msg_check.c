/* libfabric's verbs provider over MSG endpoints, which connect through
 * the RDMA CM: a passive endpoint listens on ADDR:PORT, a client
 * connects, and they exchange N messages of every size from 1 byte to
 * 64 KiB each way, every byte checked.
 *
 *   fi_msg_check server ADDR PORT
 *   fi_msg_check client ADDR PORT
 *
 * Ends with "all checks passed" (and exit 0) or names what failed. */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZE (64 * 1024)
#define ROUNDS 20

#define TRY(call)                                                                        \
	do {                                                                             \
		int rc_ = (call);                                                        \
		if (rc_) {                                                               \
			fprintf(stderr, "%s: %s (%d)\n", #call, fi_strerror(-rc_), rc_); \
			exit(1);                                                         \
		}                                                                        \
	} while (0)

static struct fid_eq *eq;
static struct fid_cq *txcq, *rxcq;
static struct fid_ep *ep;
static struct fid_mr *mr;
static char *buf;

static struct fi_info *hints(void)
{
	struct fi_info *h = fi_allocinfo();
	h->ep_attr->type = FI_EP_MSG;
	h->caps = FI_MSG;
	h->mode = FI_CONTEXT;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	h->fabric_attr->prov_name = strdup("verbs");
	return h;
}

/* Waits for a connection-manager event of type `want`. */
static void wait_event(uint32_t want, struct fi_eq_cm_entry *entry)
{
	uint32_t event;
	ssize_t n = fi_eq_sread(eq, &event, entry, sizeof *entry, 30000, 0);
	if (n < 0) {
		struct fi_eq_err_entry err = {0};
		fi_eq_readerr(eq, &err, 0);
		fprintf(stderr, "waiting for event %u: %s (%s)\n", want, fi_strerror((int)-n),
			fi_strerror(err.err));
		exit(1);
	}
	if (event != want) {
		fprintf(stderr, "event %u, not %u\n", event, want);
		exit(1);
	}
}

static void wait_completion(struct fid_cq *cq)
{
	struct fi_cq_entry c;
	for (;;) {
		ssize_t n = fi_cq_read(cq, &c, 1);
		if (n == 1)
			return;
		if (n != -FI_EAGAIN) {
			struct fi_cq_err_entry err = {0};
			fi_cq_readerr(cq, &err, 0);
			fprintf(stderr, "completion error: %s\n", fi_strerror(err.err));
			exit(1);
		}
	}
}

/* The domain's endpoint, its CQ and registered buffer. */
static struct fid_domain *setup(struct fid_fabric *fabric, struct fi_info *info)
{
	struct fid_domain *domain;
	struct fi_cq_attr cq_attr = {.size = 64, .format = FI_CQ_FORMAT_CONTEXT};
	TRY(fi_domain(fabric, info, &domain, NULL));
	TRY(fi_endpoint(domain, info, &ep, NULL));
	TRY(fi_cq_open(domain, &cq_attr, &txcq, NULL));
	TRY(fi_cq_open(domain, &cq_attr, &rxcq, NULL));
	TRY(fi_ep_bind(ep, &eq->fid, 0));
	TRY(fi_ep_bind(ep, &txcq->fid, FI_TRANSMIT));
	TRY(fi_ep_bind(ep, &rxcq->fid, FI_RECV));
	TRY(fi_enable(ep));
	buf = calloc(2, MAX_SIZE);
	TRY(fi_mr_reg(domain, buf, 2 * MAX_SIZE, FI_SEND | FI_RECV, 0, 0, 0, &mr, NULL));
	return domain;
}

static void post_recv(void)
{
	static struct fi_context ctx;
	TRY((int)fi_recv(ep, buf + MAX_SIZE, MAX_SIZE, fi_mr_desc(mr), 0, &ctx));
}

static void send_msg(size_t len, unsigned seed)
{
	static struct fi_context ctx;
	for (size_t i = 0; i < len; i++)
		buf[i] = (char)(i * 7 + seed);
	TRY((int)fi_send(ep, buf, len, fi_mr_desc(mr), 0, &ctx));
	wait_completion(txcq);
}

static void check_msg(size_t len, unsigned seed)
{
	wait_completion(rxcq);
	for (size_t i = 0; i < len; i++) {
		if (buf[MAX_SIZE + i] != (char)(i * 7 + seed)) {
			fprintf(stderr, "byte %zu of a %zu-byte message is wrong\n", i, len);
			exit(1);
		}
	}
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s server|client ADDR PORT\n", argv[0]);
		return 2;
	}
	int server = strcmp(argv[1], "server") == 0;
	struct fi_info *h = hints(), *info;
	struct fi_eq_attr eq_attr = {.wait_obj = FI_WAIT_UNSPEC};
	struct fid_fabric *fabric;
	struct fi_eq_cm_entry entry;
	TRY(fi_getinfo(FI_VERSION(1, 17), argv[2], argv[3], server ? FI_SOURCE : 0, h, &info));
	TRY(fi_fabric(info->fabric_attr, &fabric, NULL));
	TRY(fi_eq_open(fabric, &eq_attr, &eq, NULL));
	if (server) {
		struct fid_pep *pep;
		TRY(fi_passive_ep(fabric, info, &pep, NULL));
		TRY(fi_pep_bind(pep, &eq->fid, 0));
		TRY(fi_listen(pep));
		printf("listening\n");
		fflush(stdout);
		wait_event(FI_CONNREQ, &entry);
		setup(fabric, entry.info);
		post_recv();
		TRY(fi_accept(ep, NULL, 0));
		wait_event(FI_CONNECTED, &entry);
	} else {
		setup(fabric, info);
		post_recv();
		TRY(fi_connect(ep, info->dest_addr, NULL, 0));
		wait_event(FI_CONNECTED, &entry);
	}
	printf("connected\n");
	unsigned seed = 1;
	for (size_t len = 1; len <= MAX_SIZE; len *= 4) {
		for (int r = 0; r < ROUNDS; r++, seed++) {
			if (server) {
				check_msg(len, seed);
				post_recv();
				send_msg(len, seed + 1000);
			} else {
				send_msg(len, seed);
				check_msg(len, seed + 1000);
				post_recv();
			}
		}
	}
	if (!server) {
		TRY(fi_shutdown(ep, 0));
	} else {
		wait_event(FI_SHUTDOWN, &entry);
	}
	printf("all checks passed\n");
	return 0;
}
