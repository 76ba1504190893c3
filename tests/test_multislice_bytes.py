# ruff: noqa: E501  (HLO lines as XLA prints them)
"""benchmarks/multislice_scaling.py's accounting of what crosses slices, on a small HLO module
written the way XLA prints a compiled one (groups as mesh axes, iota and lists; a loop with a
known trip count)."""

from benchmarks.multislice_scaling import cross_slice_bytes

HLO = """\
HloModule jit_step, entry_computation_layout={()->f32[]}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%body (p: (s32[], f32[100])) -> (s32[], f32[100]) {
  %p = (s32[], f32[100]{0}) parameter(0)
  %g = f32[100]{0} get-tuple-element(%p), index=1
  %r = f32[100]{0} all-reduce(%g), channel_id=1, replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_1'}, use_global_device_ids=true, to_apply=%add
  %x = f32[100]{0} all-reduce(%r), channel_id=2, replica_groups=[2,2]<=[2,2]T(1,0), use_global_device_ids=true, to_apply=%add
  ROOT %t = (s32[], f32[100]{0}) tuple(%i, %x)
}

%cond (p: (s32[], f32[100])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

ENTRY %main (q: f32[100]) -> f32[] {
  %q = f32[100]{0} parameter(0)
  %w = (s32[], f32[100]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %f = f32[8]{0} all-gather(%s), channel_id=3, replica_groups=mesh['axis_0'=4] {'axis_0'}, dimensions={0}, use_global_device_ids=true
  %l = f32[2]{0} all-gather(%s), channel_id=4, replica_groups={{0,1},{2,3}}, dimensions={0}, use_global_device_ids=true
  %m = f32[10]{0} collective-permute(%q), channel_id=5, source_target_pairs={{0,1},{1,2},{3,0}}
  ROOT %o = f32[] constant(0)
}
"""


def test_only_collectives_whose_groups_span_slices_count_with_their_loops_trip_counts():
    # 4 devices in 2 slices: {0, 1} and {2, 3}.
    ops, size = cross_slice_bytes(HLO, slices=2, devices=4)
    # In the loop (3 trips): the reduction over 'axis_1' stays in a slice ({0,1}, {2,3});
    # the iota groups {0,2}, {1,3} cross: 2 groups x 2 x 400 bytes x (2 slices - 1).
    in_loop = 3 * 2 * 2 * 400
    gather = 32  # all four devices, one copy per slice crosses: 32 bytes x (2 - 1)
    permute = 2 * 40  # 1->2 and 3->0 cross; 0->1 does not
    assert (ops, size) == (3 + 1 + 1, in_loop + gather + permute)


def test_one_slice_crosses_nothing():
    assert cross_slice_bytes(HLO, slices=1, devices=4) == (0, 0)
