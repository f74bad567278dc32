// Package v1beta2 holds the AppWrapper API (group workload.codeflare.dev,
// version v1beta2) as the ft-launcher AppWrapper controller reads and writes
// it.
//
// The types are wire-compatible with the AppWrapper project's published API,
// so AppWrapper YAML written for MLBatch applies unchanged. They are defined
// here rather than imported because that project's module does not verify
// through the Go checksum database on the module proxy this project builds
// from, and importing it would also pull in Kueue.
//
// +kubebuilder:object:generate=true
// +groupName=workload.codeflare.dev
package v1beta2
