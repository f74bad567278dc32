// Package archtest holds no code: its test checks that the package graph's
// arrows point down (docs/architecture.md). The launcher's packages must
// not link the outer loop, prewarm must not import the agent above it, and
// the nvrx wire codec must not import the configuration.
package archtest
