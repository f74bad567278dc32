package kubelettest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"sort"
	"time"
)

// Image is a one-layer OCI image built from local files: what the tests run
// in their pods, with no registry and no download.
type Image struct {
	// Ref is the full image name pods use ("ftl.local/box:1"); the
	// kubelet must never pull it (imagePullPolicy Never or IfNotPresent).
	Ref string
	// Files maps a path in the image ("/box") to a file on this machine.
	Files map[string]string
	// Entrypoint is the image's default command.
	Entrypoint []string
}

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

// WriteArchive writes img as an OCI image-layout tar archive, the format
// `ctr images import` reads; the io.containerd.image.name annotation names
// the image.
func (img Image) WriteArchive(file string) error {
	layer, err := img.layer()
	if err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer)
	layerDigest := "sha256:" + hex.EncodeToString(layerSum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC().Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": img.Entrypoint, "Env": []string{"PATH=/"}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return fmt.Errorf("kubelettest: image config: %w", err)
	}
	configDesc := blobDesc("application/vnd.oci.image.config.v1+json", config)
	layerDesc := ociDescriptor{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: layerDigest, Size: int64(len(layer))}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []ociDescriptor{layerDesc},
	})
	if err != nil {
		return fmt.Errorf("kubelettest: image manifest: %w", err)
	}
	manifestDesc := blobDesc("application/vnd.oci.image.manifest.v1+json", manifest)
	manifestDesc.Annotations = map[string]string{"io.containerd.image.name": img.Ref}
	manifestDesc.Platform = map[string]string{"architecture": "amd64", "os": "linux"}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []ociDescriptor{manifestDesc}})
	if err != nil {
		return fmt.Errorf("kubelettest: image index: %w", err)
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(configDesc.Digest), config},
		{blobPath(layerDigest), layer},
		{blobPath(manifestDesc.Digest), manifest},
	} {
		if err := add(f.name, f.data); err != nil {
			return fmt.Errorf("kubelettest: image archive %s: %w", file, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("kubelettest: image archive %s: %w", file, err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("kubelettest: %w", err)
	}
	return nil
}

// layer is the image's single layer: its files plus the folders a container
// runtime mounts over.
func (img Image) layer() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"dev/", "proc/", "sys/", "etc/", "tmp/", "var/", "run/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: mode, Typeflag: tar.TypeDir}); err != nil {
			return nil, fmt.Errorf("kubelettest: image layer: %w", err)
		}
	}
	names := make([]string, 0, len(img.Files))
	for n := range img.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		data, err := os.ReadFile(img.Files[n])
		if err != nil {
			return nil, fmt.Errorf("kubelettest: image file %s: %w", n, err)
		}
		name := path.Clean("/" + n)[1:]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return nil, fmt.Errorf("kubelettest: image layer: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("kubelettest: image layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("kubelettest: image layer: %w", err)
	}
	return buf.Bytes(), nil
}

func blobDesc(mediaType string, data []byte) ociDescriptor {
	sum := sha256.Sum256(data)
	return ociDescriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
}

func blobPath(digest string) string { return "blobs/sha256/" + digest[len("sha256:"):] }
