package qemu

// VMUID is vmUID for the external tests.
var VMUID = vmUID
