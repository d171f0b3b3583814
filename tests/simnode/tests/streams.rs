//! Streams, events, copies, fills and pointer queries on the simulated driver, from a C
//! program that uses them as CUDA programs do.

mod common;

use gpuslice_testsupport::sim::SimNode;

#[test]
fn streams_events_copies_and_pointer_queries_behave_as_on_an_idle_gpu() {
    let sim = SimNode::new(1, "A10", None);
    // 1 invalid value, 400 invalid handle.
    common::run_checking(
        &sim,
        "streams",
        &[
            "create=0 priority=-5 stream_ctx=1 query=0",
            "host_fn=0 ran=1",
            "record=0 h2d=0 d2d=0 d2h=0 same=1 wait=0 query_event=0 sync_event=0 elapsed=0 ms_ok=1",
            "fill=0 word=deadbeef",
            "outside=1",
            "memtype=2 ordinal=0 range=0 base_ok=1 size=4096 host_ptr_attr=1",
            "copy2d=0,0 rows_ok=1 fill2d=0 row2=7 past=1",
            "destroyed_event=400",
            "destroyed_stream=400",
        ],
    );
}

#[test]
fn page_locked_host_memory_is_host_memory_the_device_maps_and_takes_no_device_memory() {
    let sim = SimNode::new(1, "A10", None);
    // 1 invalid value, 201 invalid context, 712 already registered, 713 not registered;
    // memory type 1 is host memory.
    common::run_checking(
        &sim,
        "hostmem",
        &[
            "no_context=201",
            "alloc=0 alloc_bad_flags=1 device_memory_taken=0 flags=2",
            "device_pointer=0 same_address=1",
            "type=1 ordinal=0 owner=1 size=1048576",
            "round_trip=1 free_host=0 free_again=1 unknown_type=1",
            "register=0 register_again=712 registered_type=1 unified_copy=0 free_registered=1",
            "unregister_inside=713 unregister=0 unregister_again=713",
        ],
    );
}

#[test]
fn device_memory_and_events_exported_by_one_process_are_opened_by_another() {
    let sim = SimNode::new(1, "A10", None);
    // 1 invalid value, 201 invalid context, 400 invalid handle. The opener takes no memory of
    // its own for it, gets the same address when it opens the handle twice, and frees it by
    // closing it as often as it opened it, not by cuMemFree.
    // Events: interprocess ones keep no timing (1 for one that would), a plain event has no
    // handle, and the opener's copy of a recorded one is complete.
    common::run_checking(
        &sim,
        "ipc",
        &[
            "export=0 export_inside=1 open_own=201",
            "interprocess_timed=1 event_plain=1 create_shared=0 event_export=0 event_record=0",
            "open_own_event=201",
            "open_event=0 query_event=0",
            "open=0 opener_taken=0 open_again=0 same=1 seen=1",
            "free_imported=1 close=0 close_last=0 close_again=1 bad_handle=400",
            "written_back=1 free=0",
        ],
    );
}

#[test]
fn a_modules_kernels_are_counted_named_enumerated_and_their_parameters_laid_out_as_cuda_12_4_drivers_do()
 {
    let sim = SimNode::new(1, "A10", None);
    // Kernels in the order of their names, parameters as ptxas lays them out; 400 invalid
    // handle, 1 invalid value (also for the index past the last parameter).
    common::run_checking(
        &sim,
        "kernels",
        &[
            "count=0 functions=2 enumerate=0 names=alpha,beta rest_null=1",
            "is_loaded=0 loaded=1 load=0 name_bogus=400",
            "kernel_name=0 kernel=beta kernels=2",
            "register=0 unregister=0 unregister_again=1 params=0:8,8:4,16:12",
            "past_last=1 untouched=7 no_size=0 offset=8 no_offset=1",
            "kernel=0 kernel_offset=16 param_bogus=400 proc_found=1",
        ],
    );
}

#[test]
fn a_kernels_attributes_and_occupancy_follow_the_devices_limits() {
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "occupancy", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // Compute capability 8.6: 1536 threads and 16 blocks an SM, 99 KiB of opt-in shared
    // memory a block; 256-thread blocks are limited by threads to 6 an SM; 768 is the
    // largest block keeping all 1536 threads resident, 2 an SM on 72 SMs.
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(
            "threads=1024 regs=32 ptx=86 set=0 too_much=1 dynamic=65536 blocks256=6 block=768 grid=144"
        )
    );
    // 100 KiB of shared memory an SM, 1 KiB reserved a block, 99 KiB at most a block: one
    // block gets 99 KiB, two 49 KiB each; seven blocks of 256 threads are more than an SM's
    // 1536 threads. No thread block clusters before compute capability 9.0.
    assert_eq!(
        lines.next(),
        Some("smem1=101376 smem2=50176 smem7=0 non_portable=1 width=1 non_portable_now=0")
    );
    // 801 is CUDA_ERROR_NOT_SUPPORTED: no clusters to count.
    assert_eq!(
        lines.next(),
        Some(
            "clusters2=-801 clusters8=-801 clusters16=-801 unset=-801 potential=-801 \
             non_portable16=-801 non_portable_potential=-801 required_as_set=-801 \
             required_other=-801 required_potential=-801"
        )
    );
    // A launch in clusters of one block runs; of more, it is refused.
    assert_eq!(
        lines.next(),
        Some(
            "launch1=0 launch2=801 ragged=801 tall=801 launch16=801 launch32=801 required=801 \
             required_other=801"
        )
    );
    let sim = SimNode::new(1, "H100", None);
    let exe = common::compile(&sim, "occupancy", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // Compute capability 9.0: 228 KiB an SM, 227 KiB at most a block, 2048 threads an SM
    // (seven blocks of 256 fit, 32 KiB less the reserve each); clusters may be set.
    assert_eq!(
        text.lines().nth(1),
        Some("smem1=232448 smem2=115712 smem7=32329 non_portable=0 width=0 non_portable_now=1")
    );
    // Clusters of 256-thread blocks, 8 resident an SM (threads and registers), on 132 SMs in
    // eight GPCs (four of 17, four of 16): 4 x (136 + 128) / 2 blocks = 528 clusters of 2,
    // 132 of 8. 16 is past the portable 8 (912 is CUDA_ERROR_INVALID_CLUSTER_SIZE), as is no
    // cluster at all; a kernel allowing non-portable sizes takes 16 (4 x (8 + 8) clusters)
    // and could take up to 16. A kernel requiring a width of 2 counts clusters of 2 where the
    // configuration sets none, refuses another size, and answers 2 as its potential size.
    assert_eq!(
        text.lines().nth(2),
        Some(
            "clusters2=528 clusters8=132 clusters16=-912 unset=-912 potential=8 \
             non_portable16=64 non_portable_potential=16 required_as_set=528 \
             required_other=-912 required_potential=2"
        )
    );
    // Launches: a grid of 63 x 2 blocks in clusters of 2 x 1 leaves a block over, 32 blocks
    // are past even the non-portable 16, and a kernel requiring 2 x 1 x 1 runs in no other.
    assert_eq!(
        text.lines().nth(3),
        Some(
            "launch1=0 launch2=0 ragged=912 tall=0 launch16=0 launch32=912 required=0 \
             required_other=912"
        )
    );
}

#[test]
fn an_event_queried_during_a_global_capture_invalidates_it_unless_the_thread_is_relaxed() {
    // PyTorch's and NCCL's threads that watch events switch to the relaxed mode for this, as
    // the interception library's do: from the default mode the driver refuses the query
    // (900) and invalidates the capture (status 2; ending it answers 901).
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "capture_modes", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    assert_eq!(
        text.trim(),
        "exchanged=0 was=0 relaxed_query=0 relaxed_sync=0 relaxed_status=1 global_query=900 \
         global_status=2 end=901 after=0"
    );
}

#[test]
fn a_caller_asking_for_cuda_12_3_gets_the_capture_query_with_edge_data() {
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "capture_info", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // Status 1 is capturing; no dependencies, no edges. Given the CUDA 11.3 variant (without
    // the edges' address), the count went into the edges' place and stayed 12345.
    assert_eq!(
        text.trim(),
        "lookup=0 found=0 info=0 status=1 has_graph=1 deps_null=1 edges_null=1 count=0"
    );
}

#[test]
fn a_captured_graph_replays_its_work_at_each_launch() {
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "graphs", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // 1 is CUDA_ERROR_INVALID_VALUE.
    assert_eq!(
        text.trim(),
        "begin=0 status=1 id_set=1 graph_seen=1 launch=0 host=0 ran_during_capture=0 end=0 nodes=2 \
         instantiate=0 launches=0,0,0 counter=3 explicit_add=0 counter_after=4 destroy=0,0 relaunch_destroyed=1"
    );
}

#[test]
fn a_graph_keeps_its_edges_a_capture_its_dependency_set_and_user_objects_live_while_held() {
    let sim = SimNode::new(1, "A10", None);
    // 1 is CUDA_ERROR_INVALID_VALUE, 304 CUDA_ERROR_OPERATING_SYSTEM, 401
    // CUDA_ERROR_ILLEGAL_STATE. Edges: a→b, a→c, b→c.
    common::run_checking(
        &sim,
        "graph_edges",
        &[
            "edges=3 read=3 first=1 rest_null=1 deps_of_c=2,1 dependents_of_a=2",
            "add_existing=1 add_self=1 add_foreign=1 node_foreign_dep=1",
            "remove=0 remove_again=1 edges_after=2 edge_data_zero=1",
            "capture_start_deps=0 capture_deps=1 update_set=0 set_now=1,1 update_add=0",
            "added_now=2 update_flags=1 update_foreign=1 captured_edges=4",
            "update_not_capturing=401",
            "to_graph=0 same_graph=1 nodes=2 edges=1",
            "create=0 create_no_flag=1 retain=0 release_too_many=1 alive_with_exec=1 destroyed=42",
            "dot=304 dot_written=0 dot_arrows=1 dot_empty=1",
        ],
    );
}

#[test]
fn managed_memory_keeps_the_hints_a_program_gives_and_refuses_other_memory() {
    let sim = SimNode::new(2, "A10", None);
    // Locations: a device ordinal, -1 the CPU, -2 none; location types 1 device, 2 host.
    // 1 is CUDA_ERROR_INVALID_VALUE, 101 CUDA_ERROR_INVALID_DEVICE.
    common::run_checking(
        &sim,
        "managed",
        &[
            "is_managed=1,0 fresh=0,-2,-2 prefetch=0 last=1 prefetch_host=0 last=-1,type=2",
            "read_mostly=0 preferred=0 accessed=0,0 said=1,0,0 by=1,-1,-2,-2",
            "several=0,1,0 unset=0 preferred_now=-2",
            "plain=1 past_end=1 bad_device=101 bad_advice=1 bad_size=1 freed=1",
        ],
    );
}

#[test]
fn graph_memory_comes_from_a_pool_that_launches_grow_and_a_trim_gives_back() {
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "graphmem", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // A10: 24576 MiB, less the process's context (362 MiB). 1 is CUDA_ERROR_INVALID_VALUE,
    // 2 CUDA_ERROR_OUT_OF_MEMORY. The pool keeps what it reserved (256 MiB, then 1 GiB) until
    // the trim; node types 10 and 11.
    assert_eq!(sim.spec.gpus[0].context_bytes, 362 << 20);
    assert_eq!(
        text.trim(),
        "start=24214 captured=0 addr=1 after_capture=24214 launch=0 after_launch=23958 \
         relaunch_held=1 free=0 after_free=23958 relaunch=0 explicit=0,0 addr2=1 launch2=0 \
         after_alloc_free=23190 too_big=2 pool=0,1024,1024,1024 nodes=2 types=10,11 \
         params=0,0 size=1024 same_addr=1,1 location=1,0 trim=0 after_trim=24214 \
         auto_free=0,0 held=23958 with_m=23830 captured_free=0 still=23830 \
         freed_by_graph=0 end=23958"
    );
}

#[test]
fn texture_and_surface_objects_are_made_over_the_memory_the_driver_allows_and_read_back() {
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "textures", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // 1 is CUDA_ERROR_INVALID_VALUE, 400 CUDA_ERROR_INVALID_HANDLE. Linear memory: 512-byte
    // alignment, inside an allocation, 1, 2 or 4 channels; pitched: a pitch of at least a
    // row, in 32-byte steps; a surface only over an array made for surface loads and
    // stores; a view only over an array. Before, every call answered 801.
    assert_eq!(
        text.trim(),
        "array=0 nonzero=1 resource_back=1 texture_back=1 no_view=1 no_texture_desc=1 \
         surface_plain=1 surface_ldst=0 surface_back=1 linear=0 surface_linear=1 misaligned=1 \
         past_allocation=1 three_channels=1 not_device_memory=1 pitched=0 pitch_unaligned=1 \
         pitch_narrow=1 view_on_linear=1 view_on_array=0 view_back=1 no_such_array=400 \
         destroy=0,0 again=1,1 read_destroyed=1"
    );
}

#[test]
fn arrays_are_copied_to_and_from_in_two_and_three_dimensions() {
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "arrays", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // 1 is CUDA_ERROR_INVALID_VALUE, 400 CUDA_ERROR_INVALID_HANDLE.
    assert_eq!(
        text.trim(),
        "create=0 copy2d=0,0 round_trip=1 row3=1 row5=1 row4_kept=1 atoa=0,0 shifted=1 \
         desc=64x16,1 past_end=1 too_wide=1 create3d=0 copy3d=0,0 round_trip3d=1 box=0 \
         box_ok=1 box_past_end=1 desc3=8x4x3 destroyed=400"
    );
}

#[test]
fn a_streams_launch_attributes_are_checked_kept_and_copied_as_the_driver_documents_them() {
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "stream_attributes", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // 1 is CUDA_ERROR_INVALID_VALUE, 400 CUDA_ERROR_INVALID_HANDLE. The A10's largest access
    // policy window is 128 MiB less 4 KiB; a miss cannot persist; priorities clamp to 0..-5;
    // cooperation and clusters are for launches and graph nodes. Before, every call answered
    // 801 (the CUDA sample simpleAttributes failed there).
    assert_eq!(
        text.trim(),
        "window=0 window_back=0,1 window_too_large=1 ratio_above_one=1 miss_persisting=1 \
         reset_l2=0 sync_default=1 sync=0 sync_back=4 sync_unknown=1 priority_made=-2 \
         priority=0 priority_clamped=-5 domain_map=0,1 domain_unknown=1 cooperative=1 \
         cluster=1 get_cluster=1 copy=0 copied_sync=4 null_stream=0 null_stream_back=2 \
         destroyed=400"
    );
}

#[test]
fn the_jit_linker_links_ptx_into_an_image_that_loads_what_its_inputs_hold() {
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "linker", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // 218 is CUDA_ERROR_INVALID_PTX, 200 CUDA_ERROR_INVALID_IMAGE, 301
    // CUDA_ERROR_FILE_NOT_FOUND, 801 CUDA_ERROR_NOT_SUPPORTED (host objects are not
    // modelled), 1 CUDA_ERROR_INVALID_VALUE, 400 CUDA_ERROR_INVALID_HANDLE. The kernel's
    // parameters lie where the PTX puts them (8-byte pointer, 4-byte int, 8-byte double at 16)
    // and its threads need the 3000-byte local array; the other input's global is loaded with
    // it. Before, cuLinkCreate answered 801.
    assert_eq!(
        text.trim(),
        "create=0 log_empty=1 add_kernel=0 add_table=0 not_ptx=218 not_cubin=200 no_file=301 \
         object=801 complete=0 same_image=1 add_after=1 load=0 globals_taken=1 global=0,4096 \
         local=3000 params=0+8,8+4,16+8 destroy=0 destroy_again=400 empty=1"
    );
}

#[test]
fn memcpy_nodes_built_by_hand_or_captured_copy_at_each_launch_and_a_clone_runs_its_own() {
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "graph_memcpy", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // 1 is CUDA_ERROR_INVALID_VALUE; node type 1 is CU_GRAPH_NODE_TYPE_MEMCPY. Nothing is
    // copied before a launch; a parameter change in the executable graph moves its copy.
    // A graph with memory nodes is not cloned (801, CUDA_ERROR_NOT_SUPPORTED); its copies
    // into and out of its own allocation run while a launch holds it. Before,
    // cuGraphAddMemcpyNode and cuGraphClone answered 801 (the CUDA samples simpleCudaGraphs
    // and jacobiCudaGraphs) and a captured copy ran at capture, recorded in no node.
    assert_eq!(
        text.trim(),
        "add=0 no_params=1 no_width=1 generic=0 type=1 params_back=1 nodes=4 instantiate=0 \
         before_launch=0 launch=0 copied=1,1 exec_set=0 relaunch=1,1 captured=0,0 \
         captured_nodes=2 captured_type=1 at_capture=0 replayed=1 clone=0 found=0,1 \
         not_a_clone=1 original_kept=1 clone_ran=1,1 memory_nodes_clone=801 \
         through_graph_memory=0,1"
    );
}

#[test]
fn a_stream_waiting_on_an_event_of_a_capture_joins_it_its_work_is_captured_and_must_be_joined_back()
{
    let sim = SimNode::new(1, "A10", None);
    let exe = common::compile(&sim, "capture_fork", &["cuda"]);
    let text = common::run(&sim, &exe, &[]);
    // 903 is CUDA_ERROR_STREAM_CAPTURE_UNMATCHED (only the stream that began a capture ends
    // it), 905 CUDA_ERROR_STREAM_CAPTURE_ISOLATION (a stream capturing something else cannot
    // wait on it), 904 CUDA_ERROR_STREAM_CAPTURE_UNJOINED (a fork's work never joined back:
    // before, the end gave a graph). Three kernels: the first, the forked one after it, the
    // last after both. Before, the second stream ran its work at once and the graph held two
    // nodes.
    assert_eq!(
        text.trim(),
        "record=0 fork=0 joined_capturing=1 same_capture=1 forked_launch=0 end_from_joined=903 \
         other_capture_waits=905 join=0 end=0 joined_after=0 nodes=3 edges=3 plain_wait=0,0 \
         unjoined_end=904 graph=0 capturing=0,0 launch_after=0"
    );
}
