/* Stub libmlx5.so.1 for uroce, written by scripts/gen-mlx5-stub: every
 * function Debian 12's libmlx5 exports, under its version node, so that
 * whatever links against libmlx5 (perftest, UCX's libuct_ib, libfabric)
 * loads. uroce is not an mlx5 device: mlx5dv_is_supported says no, so
 * those programs take their plain verbs paths, and every other function
 * fails as the real library does for a non-mlx5 device: EOPNOTSUPP as the
 * result (int), or NULL / -1 with errno = EOPNOTSUPP. Arguments are
 * ignored, so the definitions leave their lists unspecified. */
#include <errno.h>
#include <stddef.h>
#include <sys/types.h>

int mlx5dv_query_device() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_create_cq() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_init_obj() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_set_context_attr() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_create_qp() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_create_wq() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_get_clock_info() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_create_flow_action_esp() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_create_flow() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_create_flow_matcher() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_destroy_flow_matcher() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_create_flow_action_modify_header() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_create_flow_action_packet_reformat() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_devx_alloc_uar() { errno = EOPNOTSUPP; return NULL; }
void mlx5dv_devx_free_uar() {}
int mlx5dv_devx_general_cmd() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_devx_obj_create() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_devx_obj_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_obj_modify() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_obj_query() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_query_eqn() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_umem_dereg() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_devx_umem_reg() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_open_device() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_devx_cq_modify() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_cq_query() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_ind_tbl_modify() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_ind_tbl_query() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_qp_modify() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_qp_query() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_srq_modify() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_srq_query() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_wq_modify() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_wq_query() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_is_supported() { return 0; }
void *mlx5dv_devx_create_cmd_comp() { errno = EOPNOTSUPP; return NULL; }
void mlx5dv_devx_destroy_cmd_comp() {}
int mlx5dv_devx_get_async_cmd_comp() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_obj_query_async() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_alloc_dm() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_create_mkey() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_destroy_mkey() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_dr_action_create_dest_ibv_qp() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_dest_table() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_dest_vport() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_drop() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_flow_counter() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_modify_header() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_packet_reformat() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_tag() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dr_action_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_dr_domain_create() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dr_domain_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_dr_domain_sync() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_dr_matcher_create() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dr_matcher_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_dr_rule_create() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dr_rule_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_dr_table_create() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dr_table_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_qp_ex_from_ibv_qp_ex() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_devx_create_event_channel() { errno = EOPNOTSUPP; return NULL; }
void mlx5dv_devx_destroy_event_channel() {}
ssize_t mlx5dv_devx_get_event() { errno = EOPNOTSUPP; return -1; }
int mlx5dv_devx_subscribe_devx_event() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_subscribe_devx_event_fd() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_alloc_var() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_flow_meter() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dr_action_modify_flow_meter() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_dump_dr_domain() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_dump_dr_matcher() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_dump_dr_rule() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_dump_dr_table() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void mlx5dv_free_var() {}
void *mlx5dv_pp_alloc() { errno = EOPNOTSUPP; return NULL; }
void mlx5dv_pp_free() {}
void *mlx5dv_dr_action_create_default_miss() { errno = EOPNOTSUPP; return NULL; }
void mlx5dv_dr_domain_set_reclaim_device_memory() {}
int mlx5dv_modify_qp_lag_port() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_query_qp_lag_port() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_dr_action_create_dest_devx_tir() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_dest_array() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_flow_sampler() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_aso() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_pop_vlan() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dr_action_create_push_vlan() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dr_action_modify_aso() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_modify_qp_sched_elem() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_modify_qp_udp_sport() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_sched_leaf_create() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_sched_leaf_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_sched_leaf_modify() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_sched_node_create() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_sched_node_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_sched_node_modify() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_reserved_qpn_alloc() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_reserved_qpn_dealloc() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int _mlx5dv_query_port() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_devx_umem_reg_ex() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_dm_map_op_addr() { errno = EOPNOTSUPP; return NULL; }
int _mlx5dv_mkey_check() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void mlx5dv_dr_domain_allow_duplicate_rules() {}
int mlx5dv_map_ah_to_qp() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_qp_cancel_posted_send_wrs() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_crypto_login() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_crypto_login_query_state() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_crypto_logout() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_dci_stream_id_reset() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_dek_create() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dek_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_dek_query() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_dr_action_create_dest_ib_port() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_dr_matcher_set_layout() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_get_vfio_device_list() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_vfio_get_events_fd() { errno = EOPNOTSUPP; return -1; }
int mlx5dv_vfio_process_events() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_dr_aso_other_domain_link() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_dr_aso_other_domain_unlink() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_devx_alloc_msi_vector() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_devx_create_eq() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_devx_destroy_eq() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_devx_free_msi_vector() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_create_steering_anchor() { errno = EOPNOTSUPP; return NULL; }
void *mlx5dv_crypto_login_create() { errno = EOPNOTSUPP; return NULL; }
int mlx5dv_crypto_login_destroy() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_crypto_login_query() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_destroy_steering_anchor() { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *mlx5dv_dr_action_create_dest_root_table() { errno = EOPNOTSUPP; return NULL; }
