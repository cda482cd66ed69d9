/*
 * The DPDK calls of uroce's DPDK backend behind an interface of plain C
 * types, so that the Rust side needs no generated bindings: DPDK's
 * receive, transmit and mbuf calls are static inline functions and its
 * structures change between releases; here they are compiled against the
 * installed headers (Debian's DPDK 22.11). Built only with the `dpdk`
 * feature (build.rs).
 *
 * One port per backend, one receive and one transmit queue. Frames are
 * copied into mbufs from the port's pool, a chain of them when a frame
 * is longer than one mbuf's room (RoCE MTU 4096), and sent in bursts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

/* Frames queued for one transmit burst. */
#define TX_BATCH 64
/* Descriptors per queue (adjusted to what the port allows). */
#define RING_SIZE 1024

struct uroce_dpdk_port {
	uint16_t id;
	struct rte_mempool *pool;
	uint16_t queued;
	struct rte_mbuf *tx[TX_BATCH];
};

/* Starts the EAL. It pins the calling thread to its main lcore's CPU;
 * the thread is the application's (and the progress thread it starts
 * would inherit the pin), so its own CPU set is given back after. */
int uroce_dpdk_eal_init(int argc, char **argv)
{
	cpu_set_t cpus;
	int had = pthread_getaffinity_np(pthread_self(), sizeof cpus, &cpus) == 0;
	int r = rte_eal_init(argc, argv);
	if (had)
		pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
	/* Some failures (a file prefix another primary holds) leave rte_errno
	 * 0: a failure all the same. */
	return r < 0 ? (rte_errno > 0 ? -rte_errno : -EIO) : 0;
}

/* The EAL's run-time directory (its files: config, memory maps). */
const char *uroce_dpdk_runtime_dir(void)
{
	return rte_eal_get_runtime_dir();
}

uint16_t uroce_dpdk_port_count(void)
{
	return rte_eth_dev_count_avail();
}

/* The port named `name` (as its vdev or PCI address names it), or -ENODEV. */
int uroce_dpdk_port_by_name(const char *name)
{
	uint16_t id;
	return rte_eth_dev_get_port_by_name(name, &id) == 0 ? id : -ENODEV;
}

/* Closes port `id` (not started): a context refused the device lets go
 * of what its driver opened when the EAL probed it (an af_packet socket
 * in the interface's fanout group, a tap queue). */
void uroce_dpdk_close_id(uint16_t id)
{
	if (rte_eth_dev_is_valid_port(id))
		rte_eth_dev_close(id);
}

/* The name of port `id`'s driver ("" if unknown). */
const char *uroce_dpdk_driver(uint16_t id)
{
	struct rte_eth_dev_info info;
	if (rte_eth_dev_info_get(id, &info) || !info.driver_name)
		return "";
	return info.driver_name;
}

/*
 * Configures and starts port `id` with one queue each way, at the MTU it
 * has, and a pool of `mbufs` buffers (kept for a later start of the same
 * port: a pool cannot be taken back while a stopped port's queues may
 * still refer to it). `*mtu`: the MTU to set, or 0 for the port's own;
 * the MTU used is written back, and the MAC. NULL on failure, with `*err`
 * a negative errno.
 */
struct uroce_dpdk_port *uroce_dpdk_port_start(uint16_t id, uint32_t mbufs, uint8_t mac[6],
					      uint16_t *mtu, int *err)
{
	struct rte_eth_dev_info info;
	struct rte_eth_conf conf;
	struct rte_ether_addr addr;
	struct uroce_dpdk_port *p;
	char name[RTE_MEMPOOL_NAMESIZE];
	uint16_t nrx = RING_SIZE, ntx = RING_SIZE;
	int r;

	if (!rte_eth_dev_is_valid_port(id)) {
		*err = -ENODEV;
		return NULL;
	}
	r = rte_eth_dev_info_get(id, &info);
	if (r) {
		*err = r;
		return NULL;
	}
	/* The MTU asked for, else the port's as it is (configure would set
	 * 1500 otherwise, and an af_packet port passes that on to its kernel
	 * interface). */
	if (*mtu == 0 && rte_eth_dev_get_mtu(id, mtu) != 0)
		*mtu = RTE_ETHER_MTU;
	/* An mbuf takes a whole frame where the MTU allows (af_packet drops
	 * what does not fit one); past 9 KiB frames are chained. */
	uint32_t room = (uint32_t)*mtu + RTE_ETHER_HDR_LEN + 8 + RTE_PKTMBUF_HEADROOM;
	if (room < RTE_MBUF_DEFAULT_BUF_SIZE)
		room = RTE_MBUF_DEFAULT_BUF_SIZE;
	if (room > 9216 + RTE_PKTMBUF_HEADROOM)
		room = 9216 + RTE_PKTMBUF_HEADROOM;
	snprintf(name, sizeof name, "uroce-port%u-%u", id, room);
	struct rte_mempool *pool = rte_mempool_lookup(name);
	if (!pool)
		pool = rte_pktmbuf_pool_create(name, mbufs, 256, 0, (uint16_t)room,
					       rte_eth_dev_socket_id(id));
	if (!pool) {
		*err = -rte_errno;
		return NULL;
	}
	memset(&conf, 0, sizeof conf);
	/* A driver that cannot be configured for the MTU asked for (af_packet
	 * allows 1500, yet receives whatever its ring's frames hold) is
	 * configured for its largest; the mbufs are sized for the frames. */
	uint32_t most = info.max_mtu;
	uint32_t overhead = RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;
	if (info.max_rx_pktlen > overhead && info.max_rx_pktlen - overhead < most)
		most = info.max_rx_pktlen - overhead;
	conf.rxmode.mtu = *mtu <= most ? *mtu : (uint16_t)most;
	if (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_SCATTER)
		conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_SCATTER;
	if (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS)
		conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
	if ((r = rte_eth_dev_configure(id, 1, 1, &conf)) ||
	    (r = rte_eth_dev_adjust_nb_rx_tx_desc(id, &nrx, &ntx)) ||
	    (r = rte_eth_rx_queue_setup(id, 0, nrx, rte_eth_dev_socket_id(id), NULL, pool)) ||
	    (r = rte_eth_tx_queue_setup(id, 0, ntx, rte_eth_dev_socket_id(id), NULL)) ||
	    (r = rte_eth_dev_start(id))) {
		*err = r < 0 ? r : -EIO;
		return NULL;
	}
	/* Neighbour solicitations and multicast groups come to group
	 * addresses: take them all (a driver without the filter, as af_packet,
	 * passes them anyway; its refusal is not an error). */
	(void)rte_eth_allmulticast_enable(id);
	p = calloc(1, sizeof *p);
	if (!p) {
		rte_eth_dev_stop(id);
		*err = -ENOMEM;
		return NULL;
	}
	p->id = id;
	p->pool = pool;
	if (rte_eth_macaddr_get(id, &addr) == 0)
		memcpy(mac, addr.addr_bytes, 6);
	return p;
}

/* Sends what is queued; the frames the port would not take are freed.
 * Returns how many that was. */
uint32_t uroce_dpdk_flush(struct uroce_dpdk_port *p)
{
	uint16_t sent = 0;
	for (int tries = 0; sent < p->queued && tries < 16; tries++)
		sent += rte_eth_tx_burst(p->id, 0, p->tx + sent, p->queued - sent);
	uint32_t lost = p->queued - sent;
	for (uint16_t i = sent; i < p->queued; i++)
		rte_pktmbuf_free(p->tx[i]);
	p->queued = 0;
	return lost;
}

/* Stops the port (its pool stays, for a later start) and frees `p`; with
 * `close`, also closes the device (an AF_XDP port detaches its program):
 * the process is ending. */
void uroce_dpdk_port_stop(struct uroce_dpdk_port *p, int close)
{
	uroce_dpdk_flush(p);
	rte_eth_dev_stop(p->id);
	if (close)
		rte_eth_dev_close(p->id);
	free(p);
}

/*
 * Copies the frame into mbufs (chained past one mbuf's room) and queues
 * it; a full queue is sent. 0; -ENOBUFS when the pool is empty (nothing
 * queued); or how many frames the burst this started could not send.
 */
int uroce_dpdk_tx(struct uroce_dpdk_port *p, const uint8_t *frame, uint32_t len)
{
	struct rte_mbuf *head = NULL, *last = NULL;
	uint32_t off = 0;
	do {
		struct rte_mbuf *m = rte_pktmbuf_alloc(p->pool);
		if (!m) {
			rte_pktmbuf_free(head);
			return -ENOBUFS;
		}
		uint32_t room = rte_pktmbuf_tailroom(m);
		uint32_t take = len - off < room ? len - off : room;
		memcpy(rte_pktmbuf_mtod(m, uint8_t *), frame + off, take);
		m->data_len = (uint16_t)take;
		off += take;
		if (!head) {
			head = m;
		} else {
			last->next = m;
			head->nb_segs++;
		}
		head->pkt_len += take;
		last = m;
	} while (off < len);
	p->tx[p->queued++] = head;
	return p->queued == TX_BATCH ? (int)uroce_dpdk_flush(p) : 0;
}

/* Receives up to `n` frames into `bufs`. */
uint16_t uroce_dpdk_rx(struct uroce_dpdk_port *p, struct rte_mbuf **bufs, uint16_t n)
{
	return rte_eth_rx_burst(p->id, 0, bufs, n);
}

/* The whole length of a received frame, all segments. */
uint32_t uroce_dpdk_frame_len(const struct rte_mbuf *m)
{
	return m->pkt_len;
}

/* Segment `i` of a received frame: its length, and its bytes in `*data`;
 * 0 past the last. */
uint32_t uroce_dpdk_segment(const struct rte_mbuf *m, uint32_t i, const uint8_t **data)
{
	while (i-- > 0 && m)
		m = m->next;
	if (!m)
		return 0;
	*data = rte_pktmbuf_mtod(m, const uint8_t *);
	return m->data_len;
}

void uroce_dpdk_free(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

/* The port's link state: 1 up, 0 down. */
int uroce_dpdk_link_up(const struct uroce_dpdk_port *p)
{
	struct rte_eth_link link;
	memset(&link, 0, sizeof link);
	if (rte_eth_link_get_nowait(p->id, &link) != 0)
		return 0;
	return link.link_status == RTE_ETH_LINK_UP;
}

/* The port's counters: received, sent, missed (no descriptor), receive
 * errors, transmit errors, no mbuf to receive into. */
void uroce_dpdk_stats(const struct uroce_dpdk_port *p, uint64_t out[6])
{
	struct rte_eth_stats st;
	memset(out, 0, 6 * sizeof out[0]);
	if (rte_eth_stats_get(p->id, &st) != 0)
		return;
	out[0] = st.ipackets;
	out[1] = st.opackets;
	out[2] = st.imissed;
	out[3] = st.ierrors;
	out[4] = st.oerrors;
	out[5] = st.rx_nombuf;
}

/* Closes every port and releases the EAL's resources (its run-time
 * files): at process exit, when no port is in use. */
void uroce_dpdk_cleanup(void)
{
	uint16_t id;
	RTE_ETH_FOREACH_DEV(id)
	{
		rte_eth_dev_stop(id);
		rte_eth_dev_close(id);
	}
	rte_eal_cleanup();
}
