/*
 * A library that exports libfabric's control-path entry points but has no provider ops
 * tables: what commtap sees of a libfabric build it cannot decode (bad-input test).
 */
int fi_getinfo(void) { return -61; }
int fi_fabric(void) { return -61; }
