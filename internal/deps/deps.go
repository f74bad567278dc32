// Package deps pins the module's third-party dependencies while the packages
// that use them are being written; it is removed once every one is imported.
package deps

import (
	_ "github.com/hashicorp/memberlist"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/pflag"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/client/v3/concurrency"
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "golang.org/x/sys/unix"
	_ "gopkg.in/yaml.v3"
)
