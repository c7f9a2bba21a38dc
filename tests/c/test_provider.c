/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The WrapDrive OpenSSL provider against OpenSSL's default provider:
 * known answers, differential tests on random keys, lengths and splits
 * (odd lengths, in place, streaming), GCM tags (a wrong one fails), digest
 * copies, async jobs, threads and fork.
 *
 * Usage: test_provider <dir of wd.so> [reload]. The host is $WD_HOST; set
 * WD_PROVIDER_POLICY/WD_PROVIDER_THRESHOLD to choose paths. With
 * WD_TEST_KILL_PID set, the host with that pid is killed in the middle of
 * a CBC stream, which must still come out right (CPU fallback).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/async.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/provider.h>

#include "wd_crypto.h"

#include "provider_check.h"

static size_t unhex(const char *h, unsigned char *out)
{
	size_t n = 0;
	while (h[0] && h[1]) {
		sscanf(h, "%2hhx", &out[n++]);
		h += 2;
	}
	return n;
}

/* Encrypt or decrypt `in` with a cipher, in random-sized updates. */
static int run_cipher(EVP_CIPHER *c, int enc, int pad, const unsigned char *key,
		      const unsigned char *iv, const unsigned char *in, size_t len,
		      unsigned char *out, size_t *outl, int in_place)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int ok = EVP_CipherInit_ex2(ctx, c, key, iv, enc, NULL);
	ok = ok && EVP_CIPHER_CTX_set_padding(ctx, pad);
	size_t off = 0, o = 0;
	unsigned char *work = out;
	if (in_place) {
		memcpy(out, in, len);
		in = out;
	}
	while (ok && off < len) {
		size_t n = rnd() % 3 == 0 ? len - off : rnd() % (len - off + 1);
		int l = 0;
		ok = EVP_CipherUpdate(ctx, work + o, &l, in + off, (int)n);
		off += n;
		o += (size_t)l;
	}
	int l = 0;
	ok = ok && EVP_CipherFinal_ex(ctx, work + o, &l);
	o += (size_t)l;
	*outl = o;
	EVP_CIPHER_CTX_free(ctx);
	return ok;
}

static const char *stream_ciphers[] = {
	"AES-128-ECB", "AES-192-ECB", "AES-256-ECB", "AES-128-CBC", "AES-192-CBC",
	"AES-256-CBC", "AES-128-CTR", "AES-192-CTR", "AES-256-CTR",
};

static void test_kats(void)
{
	unsigned char key[64], iv[16], pt[512], want[512], out[600];
	size_t kl, n, wl;
	/* SP 800-38A F.2.1 (CBC) and F.5.1 (CTR), first block. */
	EVP_CIPHER *cbc = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=wd");
	EVP_CIPHER *ctr = EVP_CIPHER_fetch(NULL, "AES-128-CTR", "provider=wd");
	CHECK(cbc && ctr, "fetch from the wd provider");
	kl = unhex("2b7e151628aed2a6abf7158809cf4f3c", key);
	unhex("000102030405060708090a0b0c0d0e0f", iv);
	unhex("6bc1bee22e409f96e93d7e117393172a", pt);
	wl = unhex("7649abac8119b246cee98e9b12e9197d", want);
	CHECK(run_cipher(cbc, 1, 0, key, iv, pt, 16, out, &n, 0) && n == wl && !memcmp(out, want, n),
	      "AES-128-CBC known answer");
	unhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff", iv);
	unhex("874d6191b620e3261bef6864990db6ce", want);
	CHECK(run_cipher(ctr, 1, 0, key, iv, pt, 16, out, &n, 0) && !memcmp(out, want, 16),
	      "AES-128-CTR known answer");
	(void)kl;
	/* IEEE 1619 XTS vector 4, first 32 bytes. */
	EVP_CIPHER *xts = EVP_CIPHER_fetch(NULL, "AES-128-XTS", "provider=wd");
	unhex("27182818284590452353602874713526"
	      "31415926535897932384626433832795", key);
	memset(iv, 0, 16);
	for (int i = 0; i < 512; i++)
		pt[i] = (unsigned char)i;
	unhex("27a7479befa1d476489f308cd4cfa6e2a96e4bbe3208ff25287dd3819616e89c", want);
	CHECK(xts && run_cipher(xts, 1, 0, key, iv, pt, 512, out, &n, 0) && n == 512 &&
		      !memcmp(out, want, 32),
	      "AES-128-XTS known answer");
	/* GCM test case 4. */
	EVP_CIPHER *gcm = EVP_CIPHER_fetch(NULL, "AES-128-GCM", "provider=wd");
	unsigned char aad[20], tag[16], wtag[16];
	unhex("feffe9928665731c6d6a8f9467308308", key);
	unhex("cafebabefacedbaddecaf888", iv);
	n = unhex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
		  "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39", pt);
	unhex("feedfacedeadbeeffeedfacedeadbeefabaddad2", aad);
	unhex("42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e"
	      "21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091", want);
	unhex("5bc94fbc3221a5db94fae95ae7121a47", wtag);
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int l = 0, ok = gcm && EVP_EncryptInit_ex2(ctx, gcm, key, iv, NULL);
	ok = ok && EVP_EncryptUpdate(ctx, NULL, &l, aad, 20);
	ok = ok && EVP_EncryptUpdate(ctx, out, &l, pt, (int)n);
	ok = ok && EVP_EncryptFinal_ex(ctx, out + l, &l);
	ok = ok && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag);
	CHECK(ok && !memcmp(out, want, n) && !memcmp(tag, wtag, 16), "AES-128-GCM known answer");
	EVP_CIPHER_CTX_free(ctx);
	/* SHA-256("abc"). */
	EVP_MD *md = EVP_MD_fetch(NULL, "SHA256", "provider=wd");
	unsigned int dl = 0;
	unhex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", want);
	CHECK(md && EVP_Digest("abc", 3, out, &dl, md, NULL) && dl == 32 && !memcmp(out, want, 32),
	      "SHA-256 known answer");
	EVP_MD_free(md);
	EVP_CIPHER_free(cbc);
	EVP_CIPHER_free(ctr);
	EVP_CIPHER_free(xts);
	EVP_CIPHER_free(gcm);
}

static void test_ciphers_differential(int rounds)
{
	static unsigned char in[70000], a[70100], b[70100], back[70200];
	for (size_t ci = 0; ci < sizeof stream_ciphers / sizeof *stream_ciphers; ci++) {
		const char *name = stream_ciphers[ci];
		EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, name, "provider=wd");
		EVP_CIPHER *d = EVP_CIPHER_fetch(NULL, name, "provider=default");
		CHECK(w && d, "fetch %s", name);
		if (!w || !d)
			continue;
		int ctr = strstr(name, "CTR") != NULL;
		for (int r = 0; r < rounds; r++) {
			unsigned char key[32], iv[16];
			fill(key, sizeof key);
			fill(iv, sizeof iv);
			size_t len = rnd() % 3 == 0 ? rnd() % 70000 : rnd() % 300;
			fill(in, len);
			int pad = ctr ? 0 : (int)(rnd() % 2);
			if (!pad && !ctr)
				len -= len % 16;
			int in_place = (int)(rnd() % 2);
			size_t al = 0, bl = 0, cl = 0;
			int ok1 = run_cipher(w, 1, pad, key, iv, in, len, a, &al, in_place);
			int ok2 = run_cipher(d, 1, pad, key, iv, in, len, b, &bl, 0);
			CHECK(ok1 && ok2 && al == bl && !memcmp(a, b, al),
			      "%s encrypt len %zu pad %d in-place %d", name, len, pad, in_place);
			int ok3 = run_cipher(w, 0, pad, key, iv, b, bl, back, &cl, (int)(rnd() % 2));
			CHECK(ok3 && cl == len && !memcmp(back, in, len), "%s decrypt len %zu", name, len);
		}
		EVP_CIPHER_free(w);
		EVP_CIPHER_free(d);
	}
}

static void test_gcm(int rounds)
{
	static unsigned char pt[20000], ct[20000], ct2[20000], back[20000];
	const char *names[] = {"AES-128-GCM", "AES-256-GCM"};
	for (int gi = 0; gi < 2; gi++) {
		EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, names[gi], "provider=wd");
		EVP_CIPHER *d = EVP_CIPHER_fetch(NULL, names[gi], "provider=default");
		for (int r = 0; r < rounds && w && d; r++) {
			unsigned char key[32], iv[12], aad[64], tag[16], tag2[16];
			fill(key, sizeof key);
			fill(iv, sizeof iv);
			size_t aadl = rnd() % 64, len = rnd() % 20000;
			fill(aad, aadl);
			fill(pt, len);
			EVP_CIPHER *cs[2] = {w, d};
			unsigned char *outs[2] = {ct, ct2};
			unsigned char *tags[2] = {tag, tag2};
			int ok = 1;
			for (int k = 0; k < 2; k++) {
				EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
				int l = 0;
				size_t half = len / 3;
				ok = ok && EVP_EncryptInit_ex2(c, cs[k], key, iv, NULL);
				ok = ok && EVP_EncryptUpdate(c, NULL, &l, aad, (int)aadl);
				ok = ok && EVP_EncryptUpdate(c, outs[k], &l, pt, (int)half);
				ok = ok && EVP_EncryptUpdate(c, outs[k] + half, &l, pt + half, (int)(len - half));
				ok = ok && EVP_EncryptFinal_ex(c, outs[k] + len, &l);
				ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tags[k]);
				EVP_CIPHER_CTX_free(c);
			}
			CHECK(ok && !memcmp(ct, ct2, len) && !memcmp(tag, tag2, 16), "%s seal len %zu",
			      names[gi], len);
			for (int bad = 0; bad < 2; bad++) {
				EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
				int l = 0, l2 = 0;
				if (bad)
					tag[rnd() % 16] ^= (unsigned char)(1 + rnd() % 255);
				int ok2 = EVP_DecryptInit_ex2(c, w, key, iv, NULL);
				ok2 = ok2 && EVP_DecryptUpdate(c, NULL, &l, aad, (int)aadl);
				ok2 = ok2 && EVP_DecryptUpdate(c, back, &l, ct, (int)len);
				ok2 = ok2 && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 16, tag);
				int fin = ok2 && EVP_DecryptFinal_ex(c, back + l, &l2);
				if (bad)
					CHECK(ok2 && !fin, "%s wrong tag must fail", names[gi]);
				else
					CHECK(fin && !memcmp(back, pt, len), "%s open len %zu", names[gi], len);
				EVP_CIPHER_CTX_free(c);
			}
		}
		EVP_CIPHER_free(w);
		EVP_CIPHER_free(d);
	}
}

/* GCM through EVP_Cipher, the raw call: OpenSSL hands every call to the
 * provider's cipher function, the end of the message too
 * (EVP_Cipher(ctx, NULL, NULL, 0)), which must make the tag or check it.
 * What each call returns (bytes written; -1 for a failure) is compared
 * with the default provider's, on a small message and on one above the
 * default threshold. */
static void test_gcm_evp_cipher(void)
{
	static unsigned char pt[20000], ct[2][20000], back[20000];
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-GCM", cs);
	size_t lens[] = {64, 20000};
	for (int li = 0; cs[0] && cs[1] && li < 2; li++) {
		size_t len = lens[li];
		unsigned char key[16], iv[12], aad[20], tag[2][16];
		fill(key, sizeof key);
		fill(iv, sizeof iv);
		fill(aad, sizeof aad);
		fill(pt, len);
		int r[2][4];
		for (int k = 0; k < 2; k++) {
			EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
			memset(tag[k], 0, 16);
			r[k][0] = EVP_EncryptInit_ex2(c, cs[k], key, iv, NULL);
			r[k][1] = EVP_Cipher(c, NULL, aad, sizeof aad);
			r[k][2] = EVP_Cipher(c, ct[k], pt, (unsigned)len);
			r[k][3] = EVP_Cipher(c, NULL, NULL, 0);
			CHECK(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag[k]) > 0,
			      "GCM EVP_Cipher (%s) len %zu: the tag after the final call",
			      k ? "default" : "wd", len);
			EVP_CIPHER_CTX_free(c);
		}
		CHECK(!memcmp(r[0], r[1], sizeof r[0]),
		      "GCM EVP_Cipher seal len %zu returns init %d aad %d data %d final %d, default %d %d %d %d",
		      len, r[0][0], r[0][1], r[0][2], r[0][3], r[1][0], r[1][1], r[1][2], r[1][3]);
		CHECK(!memcmp(ct[0], ct[1], len) && !memcmp(tag[0], tag[1], 16),
		      "GCM EVP_Cipher seal len %zu: the default provider's ciphertext and tag", len);
		for (int bad = 0; bad < 2; bad++) {
			unsigned char t[16];
			memcpy(t, tag[1], 16);
			if (bad)
				t[rnd() % 16] ^= (unsigned char)(1 + rnd() % 255);
			int o[2][3];
			for (int k = 0; k < 2; k++) {
				EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
				int ok = EVP_DecryptInit_ex2(c, cs[k], key, iv, NULL) &&
					 EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 16, t) > 0;
				o[k][0] = ok ? EVP_Cipher(c, NULL, aad, sizeof aad) : -2;
				o[k][1] = ok ? EVP_Cipher(c, back, ct[1], (unsigned)len) : -2;
				o[k][2] = ok ? EVP_Cipher(c, NULL, NULL, 0) : -2;
				if (!bad && k == 0)
					CHECK(!memcmp(back, pt, len), "GCM EVP_Cipher open len %zu", len);
				EVP_CIPHER_CTX_free(c);
			}
			CHECK(o[0][2] == (bad ? -1 : 0) && !memcmp(o[0], o[1], sizeof o[0]),
			      "GCM EVP_Cipher open len %zu %s tag: aad %d data %d final %d, default %d %d %d",
			      len, bad ? "wrong" : "right", o[0][0], o[0][1], o[0][2], o[1][0], o[1][1],
			      o[1][2]);
		}
	}
	ERR_clear_error();
	free_both(cs);
}

/* A GCM IV serves one message: after the final call, further data, AAD
 * or another final fail until a new IV is set (the same IV again would be
 * the same keystream), also after an init that gives no IV or the same
 * key again, in both directions, as the default provider answers. A new
 * IV makes the default provider's message. */
static void test_gcm_iv_spent(void)
{
	static unsigned char pt[20000], ct[2][20000];
	EVP_CIPHER *cs[2];
	fetch_both("AES-256-GCM", cs);
	size_t lens[] = {64, 20000};
	/* After the final call: 0 data, 1 AAD, 2 final, 3 init without key or
	 * IV then data, 4 the same key without IV then data, 5 an empty
	 * update (which does nothing, and succeeds), 6 the IV length changed
	 * mid-message. */
	for (int li = 0; cs[0] && cs[1] && li < 2; li++) {
		size_t len = lens[li];
		for (int enc = 0; enc <= 1; enc++) {
			for (int what = 0; what < 7; what++) {
				unsigned char key[32], iv[12], iv2[16], tag[16];
				fill(key, sizeof key);
				fill(iv, sizeof iv);
				fill(iv2, sizeof iv2);
				fill(pt, len);
				int r[2][3], l = 0;
				if (!enc) { /* a sealed message, whose tag checks */
					EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
					int ok = EVP_EncryptInit_ex2(c, cs[1], key, iv, NULL) &&
						 EVP_EncryptUpdate(c, ct[0], &l, pt, (int)len) &&
						 EVP_EncryptFinal_ex(c, ct[0] + l, &l) &&
						 EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag) > 0;
					CHECK(ok, "GCM seal (default)");
					memcpy(pt, ct[0], len);
					EVP_CIPHER_CTX_free(c);
				}
				for (int k = 0; k < 2; k++) {
					EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
					int ok = EVP_CipherInit_ex2(c, cs[k], key, iv, enc, NULL) &&
						 (enc || EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 16, tag) > 0) &&
						 EVP_CipherUpdate(c, ct[k], &l, pt, (int)len) &&
						 EVP_CipherFinal_ex(c, ct[k] + l, &l);
					r[k][0] = ok;
					switch (what) {
					case 0: r[k][1] = EVP_CipherUpdate(c, ct[k], &l, pt, (int)len); break;
					case 1: r[k][1] = EVP_CipherUpdate(c, NULL, &l, pt, 16); break;
					case 2: r[k][1] = EVP_CipherFinal_ex(c, ct[k], &l); break;
					case 3:
						r[k][1] = EVP_CipherInit_ex2(c, NULL, NULL, NULL, enc, NULL) &&
							  EVP_CipherUpdate(c, ct[k], &l, pt, (int)len);
						break;
					case 4:
						r[k][1] = EVP_CipherInit_ex2(c, NULL, key, NULL, enc, NULL) &&
							  EVP_CipherUpdate(c, ct[k], &l, pt, (int)len);
						break;
					case 5: r[k][1] = EVP_CipherUpdate(c, ct[k], &l, pt, 0); break;
					case 6:
						r[k][1] = EVP_CipherInit_ex2(c, NULL, NULL, iv, enc, NULL) &&
							  EVP_CipherUpdate(c, ct[k], &l, pt, 16) &&
							  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_IVLEN, 16, NULL) > 0 &&
							  EVP_CipherUpdate(c, ct[k], &l, pt, 16);
						/* The IV length was 16 for the new IV below. */
						break;
					}
					/* A new IV: a new message, the default provider's. */
					r[k][2] = EVP_CipherInit_ex2(c, NULL, NULL, iv2, enc, NULL) &&
						  EVP_CipherUpdate(c, ct[k], &l, pt, (int)len) && l == (int)len;
					EVP_CIPHER_CTX_free(c);
				}
				CHECK(r[0][0] && r[0][1] == (what == 5) && r[0][2] && !memcmp(r[0], r[1], sizeof r[0]) &&
					      !memcmp(ct[0], ct[1], len),
				      "GCM %s len %zu case %d after the final call: wd %d %d %d, default %d %d %d",
				      enc ? "seal" : "open", len, what, r[0][0], r[0][1], r[0][2], r[1][0],
				      r[1][1], r[1][2]);
			}
		}
	}
	ERR_clear_error();
	free_both(cs);
}

/* TLS record-layer parameters given at init (EVP_CipherInit_ex2 with the
 * TLS version and MAC size) apply with that init's key and IV: on a new
 * context and on one used before with another key, a TLS 1.2 CBC record
 * comes out as the default provider makes it, both ways. */
static void test_tls_params_at_init(void)
{
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-CBC", cs);
	for (int reuse = 0; cs[0] && cs[1] && reuse <= 1; reuse++) {
		unsigned char k1[16], k2[16], iv[16], rec[64], out[2][64], back[2][64];
		fill(k1, sizeof k1);
		fill(k2, sizeof k2);
		fill(iv, sizeof iv);
		fill(rec, 48);
		memset(rec + 48, 15, 16); /* the record's padding, as libssl adds it */
		int r[2][4];
		for (int k = 0; k < 2; k++) {
			for (int enc = 1; enc >= 0; enc--) {
				unsigned int ver = 0x0303;
				size_t mac = 0;
				OSSL_PARAM p[] = {OSSL_PARAM_construct_uint(OSSL_CIPHER_PARAM_TLS_VERSION, &ver),
						  OSSL_PARAM_construct_size_t(OSSL_CIPHER_PARAM_TLS_MAC_SIZE, &mac),
						  OSSL_PARAM_END};
				EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
				if (reuse) {
					unsigned char junk[32];
					int l = 0;
					EVP_CipherInit_ex2(c, cs[k], k1, iv, enc, NULL);
					EVP_CipherUpdate(c, junk, &l, rec, 16);
				}
				r[k][enc * 2] = EVP_CipherInit_ex2(c, reuse ? NULL : cs[k], k2, iv, enc, p);
				memset(enc ? out[k] : back[k], 0, 64);
				r[k][enc * 2 + 1] = enc ? EVP_Cipher(c, out[k], rec, 64)
							: EVP_Cipher(c, back[k], out[k], 64);
				EVP_CIPHER_CTX_free(c);
			}
		}
		CHECK(r[0][2] == 1 && r[0][3] > 0 && !memcmp(r[0], r[1], sizeof r[0]) &&
			      !memcmp(out[0], out[1], 64) && !memcmp(back[0], back[1], 64),
		      "TLS parameters at init (%s context): wd init %d record %d back %d %d, default %d %d %d %d",
		      reuse ? "used" : "new", r[0][2], r[0][3], r[0][0], r[0][1], r[1][2], r[1][3], r[1][0],
		      r[1][1]);
	}
	ERR_clear_error();
	free_both(cs);
}

/* The chaining value and CTR's position in its block, where the stream
 * is now (on the device session or in the inline context): read through
 * EVP_CIPHER_CTX_get_updated_iv and the "num" parameter, and carried by a
 * copy of the context, which goes on as the original does; all as the
 * default provider, after small and large requests. */
static void test_chain_state(void)
{
	static unsigned char in[70100], a[70200], b[70200];
	const char *names[] = {"AES-128-CBC", "AES-256-CTR"};
	size_t lens[] = {32, 37, 4096, 4001, 70000, 70001};
	for (int ni = 0; ni < 2; ni++) {
		EVP_CIPHER *cs[2];
		fetch_both(names[ni], cs);
		int ctr = ni == 1;
		for (size_t li = 0; cs[0] && cs[1] && li < sizeof lens / sizeof *lens; li++) {
			size_t len = lens[li];
			if (!ctr && len % 16 != 0)
				continue;
			unsigned char key[32], iv[16], uiv[2][16], civ[2][16];
			unsigned int num[2] = {99, 99}, cnum[2] = {99, 99};
			fill(key, sizeof key);
			fill(iv, sizeof iv);
			fill(in, len + 100);
			EVP_CIPHER_CTX *c[2], *d[2];
			int ok = 1;
			unsigned char *outs[2] = {a, b};
			for (int k = 0; k < 2; k++) {
				int l = 0;
				c[k] = EVP_CIPHER_CTX_new();
				d[k] = EVP_CIPHER_CTX_new();
				ok = ok && EVP_EncryptInit_ex2(c[k], cs[k], key, iv, NULL) &&
				     EVP_CIPHER_CTX_set_padding(c[k], 0) &&
				     EVP_EncryptUpdate(c[k], outs[k], &l, in, (int)len);
				OSSL_PARAM p[] = {OSSL_PARAM_construct_uint(OSSL_CIPHER_PARAM_NUM, &num[k]),
						  OSSL_PARAM_END};
				ok = ok && EVP_CIPHER_CTX_get_updated_iv(c[k], uiv[k], 16) &&
				     EVP_CIPHER_CTX_get_params(c[k], p);
				/* The copy goes on with the rest; the original with the
				 * same rest, for comparison. */
				ok = ok && EVP_CIPHER_CTX_copy(d[k], c[k]);
				int m = 0;
				ok = ok && EVP_EncryptUpdate(d[k], outs[k] + len, &m, in + len, 48) &&
				     EVP_EncryptUpdate(c[k], outs[k] + len + 48, &l, in + len, 48);
				OSSL_PARAM q[] = {OSSL_PARAM_construct_uint(OSSL_CIPHER_PARAM_NUM, &cnum[k]),
						  OSSL_PARAM_END};
				ok = ok && EVP_CIPHER_CTX_get_updated_iv(d[k], civ[k], 16) &&
				     EVP_CIPHER_CTX_get_params(d[k], q);
				EVP_CIPHER_CTX_free(c[k]);
				EVP_CIPHER_CTX_free(d[k]);
			}
			CHECK(ok && !memcmp(uiv[0], uiv[1], 16) && num[0] == num[1],
			      "%s after %zu bytes: updated IV %02x%02x.. num %u, default %02x%02x.. num %u",
			      names[ni], len, uiv[0][0], uiv[0][15], num[0], uiv[1][0], uiv[1][15], num[1]);
			CHECK(ok && !memcmp(a, b, len + 96) && !memcmp(a + len, a + len + 48, 48),
			      "%s copied after %zu bytes: goes on as the original and the default", names[ni],
			      len);
			CHECK(ok && !memcmp(civ[0], civ[1], 16) && cnum[0] == cnum[1],
			      "%s copy after %zu + 48 bytes: updated IV and num as the default (num %u, %u)",
			      names[ni], len, cnum[0], cnum[1]);
		}
		free_both(cs);
	}
}

/* A GCM IV length changed after the IV was given makes that IV unusable
 * (the default provider marks it finished): data fails until an IV of the
 * new length comes, and then the message is the default provider's. A
 * length this provider cannot take (past 16 bytes; the default provider
 * takes it) fails, and leaves the old IV unusable too. The same length
 * again changes nothing. */
static void test_gcm_ivlen_change(void)
{
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-GCM", cs);
	size_t newlens[] = {16, 12, 8, 20};
	for (size_t ni = 0; cs[0] && cs[1] && ni < sizeof newlens / sizeof *newlens; ni++) {
		size_t nl = newlens[ni];
		unsigned char key[16], iv[12], iv2[16], pt[64], ct[2][64];
		fill(key, sizeof key);
		fill(iv, sizeof iv);
		fill(iv2, sizeof iv2);
		fill(pt, sizeof pt);
		int r[2][3];
		for (int k = 0; k < 2; k++) {
			EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
			int l = 0;
			int ok = EVP_EncryptInit_ex2(c, cs[k], key, iv, NULL);
			r[k][0] = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_IVLEN, (int)nl, NULL) > 0;
			r[k][1] = ok && EVP_EncryptUpdate(c, ct[k], &l, pt, sizeof pt);
			r[k][2] = nl > 16 || (EVP_EncryptInit_ex2(c, NULL, NULL, iv2, NULL) &&
					      EVP_EncryptUpdate(c, ct[k], &l, pt, sizeof pt) &&
					      EVP_CIPHER_CTX_get_iv_length(c) == (int)nl);
			EVP_CIPHER_CTX_free(c);
		}
		int same = nl == sizeof iv;
		CHECK(r[0][0] == (nl <= 16) && r[0][1] == same && r[1][1] == same && r[0][2] && r[1][2] &&
			      !memcmp(ct[0], ct[1], sizeof pt),
		      "GCM IV length 12 -> %zu after the IV: set %d, data %d, new IV %d; default %d %d %d", nl,
		      r[0][0], r[0][1], r[0][2], r[1][0], r[1][1], r[1][2]);
	}
	ERR_clear_error();
	free_both(cs);
}

static void test_digests(int rounds)
{
	static unsigned char in[100000];
	const char *names[] = {"SHA1", "SHA224", "SHA256", "SHA384", "SHA512"};
	for (int i = 0; i < 5; i++) {
		EVP_MD *w = EVP_MD_fetch(NULL, names[i], "provider=wd");
		EVP_MD *d = EVP_MD_fetch(NULL, names[i], "provider=default");
		for (int r = 0; r < rounds && w && d; r++) {
			size_t len = rnd() % 3 == 0 ? rnd() % 100000 : rnd() % 500;
			fill(in, len);
			unsigned char a[64], b[64], c[64];
			unsigned int al = 0, bl = 0, cl = 0;
			EVP_MD_CTX *x = EVP_MD_CTX_new(), *y = EVP_MD_CTX_new();
			size_t cut = len ? rnd() % len : 0;
			int ok = EVP_DigestInit_ex2(x, w, NULL) && EVP_DigestUpdate(x, in, cut);
			/* A copy taken mid-way finishes to the same digest, the
			 * message gathered, on the CPU or streaming on the device
			 * (python's hashlib copies on every digest()). */
			int copied = EVP_MD_CTX_copy_ex(y, x);
			CHECK(copied, "%s copy at %zu of %zu", names[i], cut, len);
			ok = ok && EVP_DigestUpdate(x, in + cut, len - cut) && EVP_DigestFinal_ex(x, a, &al);
			ok = ok && EVP_Digest(in, len, b, &bl, d, NULL);
			CHECK(ok && al == bl && !memcmp(a, b, al), "%s len %zu", names[i], len);
			if (copied) {
				int ok2 = EVP_DigestUpdate(y, in + cut, len - cut) && EVP_DigestFinal_ex(y, c, &cl);
				CHECK(ok2 && !memcmp(c, b, bl), "%s copy at %zu", names[i], cut);
			}
			EVP_MD_CTX_free(x);
			EVP_MD_CTX_free(y);
		}
		EVP_MD_free(w);
		EVP_MD_free(d);
	}
}

/* ---- async jobs ---------------------------------------------------------- */

struct job_arg {
	EVP_CIPHER *c;
	unsigned char key[16], iv[16], in[8192], out[8192];
	int ok;
};

static int job_fn(void *varg)
{
	struct job_arg *a = *(struct job_arg **)varg;
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int l = 0;
	a->ok = EVP_EncryptInit_ex2(ctx, a->c, a->key, a->iv, NULL) &&
		EVP_CIPHER_CTX_set_padding(ctx, 0) &&
		EVP_EncryptUpdate(ctx, a->out, &l, a->in, sizeof a->in) && l == (int)sizeof a->in;
	EVP_CIPHER_CTX_free(ctx);
	return a->ok;
}

static void test_async(void)
{
	enum { N = 16 };
	if (!ASYNC_is_capable()) {
		fprintf(stderr, "skip: ASYNC jobs not supported here\n");
		return;
	}
	EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=wd");
	EVP_CIPHER *d = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=default");
	static struct job_arg args[N];
	ASYNC_JOB *jobs[N] = {0};
	ASYNC_WAIT_CTX *wctx[N];
	int done[N] = {0}, left = N, ret;
	for (int i = 0; i < N; i++) {
		fill(args[i].key, 16);
		fill(args[i].iv, 16);
		fill(args[i].in, sizeof args[i].in);
		args[i].c = w;
		wctx[i] = ASYNC_WAIT_CTX_new();
		struct job_arg *p = &args[i];
		switch (ASYNC_start_job(&jobs[i], wctx[i], &ret, job_fn, &p, sizeof p)) {
		case ASYNC_FINISH:
			done[i] = 1;
			left--;
			break;
		case ASYNC_PAUSE:
			break;
		default:
			CHECK(0, "job %d failed to start", i);
			done[i] = 1;
			left--;
		}
	}
	int rounds = 0;
	while (left > 0 && rounds++ < 100000) {
		fd_set set;
		FD_ZERO(&set);
		int maxfd = -1;
		for (int i = 0; i < N; i++) {
			size_t nfd = 0;
			OSSL_ASYNC_FD fd;
			if (done[i] || !ASYNC_WAIT_CTX_get_all_fds(wctx[i], NULL, &nfd) || nfd != 1)
				continue;
			ASYNC_WAIT_CTX_get_all_fds(wctx[i], &fd, &nfd);
			FD_SET(fd, &set);
			if (fd > maxfd)
				maxfd = fd;
		}
		struct timeval tv = {5, 0};
		if (maxfd >= 0)
			CHECK(select(maxfd + 1, &set, NULL, NULL, &tv) > 0, "a paused job's fd became readable");
		for (int i = 0; i < N; i++) {
			if (done[i])
				continue;
			struct job_arg *p = &args[i];
			int r = ASYNC_start_job(&jobs[i], wctx[i], &ret, job_fn, &p, sizeof p);
			if (r == ASYNC_FINISH || r == ASYNC_ERR) {
				done[i] = 1;
				left--;
			}
		}
	}
	CHECK(left == 0, "all async jobs finished");
	for (int i = 0; i < N; i++) {
		unsigned char want[8192];
		size_t wl = 0;
		run_cipher(d, 1, 0, args[i].key, args[i].iv, args[i].in, sizeof args[i].in, want, &wl, 0);
		CHECK(args[i].ok && !memcmp(want, args[i].out, wl), "async job %d result", i);
		ASYNC_WAIT_CTX_free(wctx[i]);
	}
	EVP_CIPHER_free(w);
	EVP_CIPHER_free(d);
}

/* ---- threads and fork ----------------------------------------------------- */

static void *thread_fn(void *unused)
{
	(void)unused;
	static __thread unsigned char in[4096], a[4200], b[4200];
	EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, "AES-256-CTR", "provider=wd");
	EVP_CIPHER *d = EVP_CIPHER_fetch(NULL, "AES-256-CTR", "provider=default");
	long bad = 0;
	for (int r = 0; r < 200; r++) {
		unsigned char key[32], iv[16];
		for (int i = 0; i < 32; i++)
			key[i] = (unsigned char)(r * 7 + i);
		memset(iv, r, 16);
		for (int i = 0; i < 4096; i++)
			in[i] = (unsigned char)(i ^ r);
		size_t al, bl;
		if (!run_cipher(w, 1, 0, key, iv, in, 4096, a, &al, 0) ||
		    !run_cipher(d, 1, 0, key, iv, in, 4096, b, &bl, 0) || memcmp(a, b, 4096))
			bad++;
	}
	EVP_CIPHER_free(w);
	EVP_CIPHER_free(d);
	return (void *)bad;
}

static void test_threads(void)
{
	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, thread_fn, NULL);
	for (int i = 0; i < 4; i++) {
		void *bad;
		pthread_join(t[i], &bad);
		CHECK(bad == NULL, "thread %d: %ld mismatches", i, (long)bad);
	}
}

static void test_fork(void)
{
	EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=wd");
	EVP_CIPHER *d = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=default");
	unsigned char key[16] = {1}, iv[16] = {2}, in[4096], a[4200], b[4200];
	fill(in, sizeof in);
	size_t al, bl;
	run_cipher(w, 1, 0, key, iv, in, sizeof in, a, &al, 0); /* the parent has queues now */
	pid_t pid = fork();
	if (pid == 0) {
		int ok = run_cipher(w, 1, 0, key, iv, in, sizeof in, a, &al, 0) &&
			 run_cipher(d, 1, 0, key, iv, in, sizeof in, b, &bl, 0) && !memcmp(a, b, al);
		_exit(ok ? 0 : 1);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the provider works in a forked child");
	CHECK(run_cipher(w, 1, 0, key, iv, in, sizeof in, a, &al, 0), "and still in the parent");
	EVP_CIPHER_free(w);
	EVP_CIPHER_free(d);
}

/* Small requests take the provider's fast path (straight to the default
 * provider's update): 10000 of them in one context, each counted (the
 * counts are handed over every 4096) and the stream the default provider
 * makes. */
static void test_small_requests_counted(void)
{
	EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=wd");
	EVP_CIPHER *d = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=default");
	enum { N = 10000 };
	static unsigned char in[16 * N], a[16 * N], b[16 * N];
	unsigned char key[16], iv[16];
	fill(key, 16);
	fill(iv, 16);
	fill(in, sizeof in);
	struct wd_crypto_stats s0, s1;
	wd_crypto_get_stats(&s0);
	EVP_CIPHER_CTX *wc = EVP_CIPHER_CTX_new(), *dc = EVP_CIPHER_CTX_new();
	int ok = EVP_EncryptInit_ex2(wc, w, key, iv, NULL) && EVP_CIPHER_CTX_set_padding(wc, 0) &&
		 EVP_EncryptInit_ex2(dc, d, key, iv, NULL) && EVP_CIPHER_CTX_set_padding(dc, 0);
	for (int i = 0; ok && i < N; i++) {
		int l = 0, m = 0;
		ok = EVP_EncryptUpdate(wc, a + 16 * i, &l, in + 16 * i, 16) && l == 16 &&
		     EVP_EncryptUpdate(dc, b + 16 * i, &m, in + 16 * i, 16) && m == 16;
	}
	EVP_CIPHER_CTX_free(wc);
	EVP_CIPHER_CTX_free(dc);
	wd_crypto_get_stats(&s1);
	CHECK(ok && !memcmp(a, b, sizeof a), "10000 small requests: the default provider's stream");
	uint64_t counted = s1.cpu_requests - s0.cpu_requests + s1.offload_requests - s0.offload_requests;
	uint64_t bytes = s1.cpu_bytes - s0.cpu_bytes + s1.offload_bytes - s0.offload_bytes;
	CHECK(counted >= N && bytes >= 16 * (uint64_t)N, "every small request counted (%llu)",
	      (unsigned long long)counted);
	EVP_CIPHER_free(w);
	EVP_CIPHER_free(d);
}

/* One stream in pieces of mixed sizes: small whole blocks (the fast path),
 * partial blocks (which close its gate until the buffered bytes are used),
 * requests above the threshold (which take the chain away), and runs of
 * more than 4096 small ones (the fast path hands its counts over mid-way),
 * in both directions, with and without padding, against the default
 * provider fed the same pieces. */
static void test_mixed_pieces(void)
{
	static const size_t sizes[] = {16, 32, 48, 5, 11, 16, 0, 1, 4096, 65536, 16, 20000};
	static unsigned char in[1 << 20], a[(1 << 20) + 32], b[(1 << 20) + 32];
	const char *names[] = {"AES-128-CBC", "AES-256-ECB", "AES-128-CTR"};
	for (size_t ni = 0; ni < 3; ni++) {
		EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, names[ni], "provider=wd");
		EVP_CIPHER *d = EVP_CIPHER_fetch(NULL, names[ni], "provider=default");
		CHECK(w && d, "fetch %s", names[ni]);
		for (int enc = 0; w && d && enc <= 1; enc++) {
			for (int pad = 0; pad <= 1; pad++) {
				unsigned char key[32], iv[16];
				fill(key, sizeof key);
				fill(iv, sizeof iv);
				size_t pieces[6000], n = 0, total = 0;
				/* A run of 5000 small requests first, then a mix. */
				while (n < 5000)
					total += pieces[n++] = 16;
				while (n < 6000 && total < sizeof in - 70000)
					total += pieces[n] = sizes[rnd() % (sizeof sizes / sizeof *sizes)],
						 n++;
				/* Whole blocks in all, so that decryption with padding
				 * off has a valid input. */
				if (total % 16 != 0 && n < 6000)
					total += pieces[n++] = 16 - total % 16;
				fill(in, total);
				EVP_CIPHER_CTX *wc = EVP_CIPHER_CTX_new(), *dc = EVP_CIPHER_CTX_new();
				int ok = EVP_CipherInit_ex2(wc, w, key, iv, enc, NULL) &&
					 EVP_CIPHER_CTX_set_padding(wc, pad) &&
					 EVP_CipherInit_ex2(dc, d, key, iv, enc, NULL) &&
					 EVP_CIPHER_CTX_set_padding(dc, pad);
				size_t off = 0, ao = 0, bo = 0;
				for (size_t i = 0; ok && i < n; i++) {
					int l = 0, m = 0;
					ok = EVP_CipherUpdate(wc, a + ao, &l, in + off, (int)pieces[i]) &&
					     EVP_CipherUpdate(dc, b + bo, &m, in + off, (int)pieces[i]);
					off += pieces[i];
					ao += (size_t)l;
					bo += (size_t)m;
				}
				int l = 0, m = 0;
				int fa = ok && EVP_CipherFinal_ex(wc, a + ao, &l);
				int fb = ok && EVP_CipherFinal_ex(dc, b + bo, &m);
				ao += (size_t)l;
				bo += (size_t)m;
				/* Decrypting random bytes with padding on may fail the
				 * padding check: then both must fail. */
				CHECK(ok && fa == fb && ao == bo && !memcmp(a, b, ao),
				      "%s %s pad %d: %zu pieces, %zu bytes, as the default provider",
				      names[ni], enc ? "encrypt" : "decrypt", pad, n, total);
				EVP_CIPHER_CTX_free(wc);
				EVP_CIPHER_CTX_free(dc);
			}
		}
		EVP_CIPHER_free(w);
		EVP_CIPHER_free(d);
	}
}

/* Requests above the threshold that a CPU answer of the router, reused,
 * keeps here (the second gate, wd_cipher_update_reused): runs of one size
 * and sizes just inside and outside the band an answer holds for (half to
 * twice the size it was made for), partial blocks between them, in both
 * directions, each request counted once, in bytes too, once the context
 * is freed (the gate's counts wait for the next hand-over), and the
 * stream the default provider makes. */
static void test_reused_answers_counted(void)
{
	size_t t = wd_crypto_get_threshold();
	t = t < 16 ? 16 : (t + 15) / 16 * 16;
	const size_t sizes[] = {t, t, t, t / 2 + 16, 2 * t - 16, 2 * t, 4 * t, 5, 11, 16};
	enum { N = 3000 };
	static unsigned char in[N * 1024 + 16], a[sizeof in + 32], b[sizeof in + 32];
	const char *names[] = {"AES-128-CBC", "AES-128-CTR"};
	if (4 * t > 1024) {
		printf("skip: reused answers (threshold %zu)\n", t);
		return;
	}
	for (size_t ni = 0; ni < 2; ni++) {
		EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, names[ni], "provider=wd");
		EVP_CIPHER *d = EVP_CIPHER_fetch(NULL, names[ni], "provider=default");
		CHECK(w && d, "fetch %s", names[ni]);
		for (int enc = 0; w && d && enc <= 1; enc++) {
			unsigned char key[16], iv[16];
			fill(key, sizeof key);
			fill(iv, sizeof iv);
			size_t pieces[N], total = 0, n = 0;
			/* Runs of up to 300 of one size, longer than an answer is
			 * reused for (WD_ROUTE_MEMO_REUSE_MAX). */
			while (n < N) {
				size_t size = sizes[rnd() % (sizeof sizes / sizeof *sizes)];
				for (size_t run = rnd() % 300 + 1; run > 0 && n < N; run--)
					total += pieces[n++] = size;
			}
			if (total % 16 != 0) {
				pieces[n - 1] += 16 - total % 16;
				total += 16 - total % 16;
			}
			fill(in, total);
			struct wd_crypto_stats s0, s1;
			wd_crypto_get_stats(&s0);
			EVP_CIPHER_CTX *wc = EVP_CIPHER_CTX_new(), *dc = EVP_CIPHER_CTX_new();
			int ok = EVP_CipherInit_ex2(wc, w, key, iv, enc, NULL) &&
				 EVP_CIPHER_CTX_set_padding(wc, 0) &&
				 EVP_CipherInit_ex2(dc, d, key, iv, enc, NULL) &&
				 EVP_CIPHER_CTX_set_padding(dc, 0);
			size_t off = 0, ao = 0, bo = 0;
			for (size_t i = 0; ok && i < n; i++) {
				int l = 0, m = 0;
				ok = EVP_CipherUpdate(wc, a + ao, &l, in + off, (int)pieces[i]) &&
				     EVP_CipherUpdate(dc, b + bo, &m, in + off, (int)pieces[i]);
				off += pieces[i];
				ao += (size_t)l;
				bo += (size_t)m;
			}
			int l = 0, m = 0;
			ok = ok && EVP_CipherFinal_ex(wc, a + ao, &l) && EVP_CipherFinal_ex(dc, b + bo, &m);
			ao += (size_t)l;
			bo += (size_t)m;
			EVP_CIPHER_CTX_free(wc);
			EVP_CIPHER_CTX_free(dc);
			wd_crypto_get_stats(&s1);
			CHECK(ok && ao == total && bo == total && !memcmp(a, b, total),
			      "%s %s: %zu requests, %zu bytes, as the default provider", names[ni],
			      enc ? "encrypt" : "decrypt", n, total);
			/* Every byte once. CTR runs each request whole; CBC keeps
			 * a partial block for later, and runs a request that
			 * completes one as two (that block, then the rest). */
			uint64_t counted = s1.cpu_requests - s0.cpu_requests + s1.offload_requests -
					   s0.offload_requests;
			uint64_t bytes = s1.cpu_bytes - s0.cpu_bytes + s1.offload_bytes - s0.offload_bytes;
			int ctr = ni == 1;
			CHECK(bytes == total && (ctr ? counted == n : counted >= n / 4 && counted <= 2 * n),
			      "%s %s: %llu of %zu requests counted, %llu of %zu bytes", names[ni],
			      enc ? "encrypt" : "decrypt", (unsigned long long)counted, n,
			      (unsigned long long)bytes, total);
		}
		EVP_CIPHER_free(w);
		EVP_CIPHER_free(d);
	}
}

/* Small digests one after another, as EVP_Digest makes them (a context
 * per message: the provider keeps a freed one for the next), with two
 * contexts of one digest open at once and a copy, against the default
 * provider. */
static void test_small_digests(void)
{
	const char *names[] = {"SHA1", "SHA256", "SHA512"};
	unsigned char in[300];
	for (int i = 0; i < 3; i++) {
		EVP_MD *w = EVP_MD_fetch(NULL, names[i], "provider=wd");
		EVP_MD *d = EVP_MD_fetch(NULL, names[i], "provider=default");
		int ok = w != NULL && d != NULL;
		for (int r = 0; ok && r < 2000; r++) {
			size_t len = rnd() % sizeof in;
			fill(in, len);
			unsigned char a[64], b[64], c[64], e[64];
			unsigned int al = 0, bl = 0, cl = 0, el = 0;
			ok = EVP_Digest(in, len, a, &al, w, NULL) && EVP_Digest(in, len, b, &bl, d, NULL) &&
			     al == bl && !memcmp(a, b, al);
			if (ok && r % 100 == 0) {
				EVP_MD_CTX *x = EVP_MD_CTX_new(), *y = EVP_MD_CTX_new(),
					   *z = EVP_MD_CTX_new();
				ok = EVP_DigestInit_ex2(x, w, NULL) && EVP_DigestInit_ex2(y, w, NULL) &&
				     EVP_DigestUpdate(x, in, len / 2) && EVP_DigestUpdate(y, "x", 1) &&
				     EVP_MD_CTX_copy_ex(z, x) &&
				     EVP_DigestUpdate(x, in + len / 2, len - len / 2) &&
				     EVP_DigestUpdate(z, in + len / 2, len - len / 2) &&
				     EVP_DigestFinal_ex(x, c, &cl) && EVP_DigestFinal_ex(z, e, &el) &&
				     cl == bl && !memcmp(c, b, bl) && el == bl && !memcmp(e, b, bl);
				EVP_MD_CTX_free(x);
				EVP_MD_CTX_free(y); /* unfinished: not kept */
				EVP_MD_CTX_free(z);
			}
		}
		CHECK(ok, "%s: 2000 small digests as the default provider's", names[i]);
		EVP_MD_free(w);
		EVP_MD_free(d);
	}
}

/* A copy of a digest context routes and counts as the original: HMAC,
 * the TLS PRF and HKDF copy contexts all the time. In a thread (whose end
 * hands its counts over): small messages, each finished in a copy, then
 * a message of the copy's own; every one counted, and below the
 * threshold as such. */
static void *copied_digests_fn(void *arg)
{
	EVP_MD *w = arg;
	unsigned char in[16] = {1}, out[64];
	unsigned int l = 0;
	long bad = 0;
	for (int i = 0; i < 200; i++) {
		EVP_MD_CTX *a = EVP_MD_CTX_new(), *b = EVP_MD_CTX_new();
		if (!EVP_DigestInit_ex2(a, w, NULL) || !EVP_DigestUpdate(a, in, sizeof in) ||
		    !EVP_MD_CTX_copy_ex(b, a) || !EVP_DigestFinal_ex(b, out, &l) ||
		    !EVP_DigestInit_ex2(b, NULL, NULL) || !EVP_DigestUpdate(b, in, sizeof in) ||
		    !EVP_DigestFinal_ex(b, out, &l))
			bad++;
		EVP_MD_CTX_free(a);
		EVP_MD_CTX_free(b);
	}
	return (void *)bad;
}

static void test_copied_digests_counted(void)
{
	EVP_MD *w = EVP_MD_fetch(NULL, "SHA256", "provider=wd");
	CHECK(w != NULL, "fetch SHA256");
	if (w == NULL)
		return;
	struct wd_crypto_stats s0, s1;
	wd_crypto_get_stats(&s0);
	pthread_t t;
	void *bad = NULL;
	pthread_create(&t, NULL, copied_digests_fn, w);
	pthread_join(t, &bad);
	wd_crypto_get_stats(&s1);
	uint64_t counted = s1.cpu_requests - s0.cpu_requests + s1.offload_requests - s0.offload_requests;
	uint64_t below = s1.cpu_below_threshold - s0.cpu_below_threshold;
	CHECK(bad == NULL && counted >= 400, "400 digests in copied contexts, %llu counted",
	      (unsigned long long)counted);
	if (wd_crypto_get_threshold() > 16)
		CHECK(below >= 400, "400 digests of 16 bytes in copied contexts, %llu below the threshold",
		      (unsigned long long)below);
	EVP_MD_free(w);
}

/* A digest context used again after its final call without an init (a
 * new message, as the default provider starts) frees the last message's
 * session: 1000 messages at the threshold (so on the device path) leave
 * the heap as it was, give or take. */
static void test_digest_again_without_init(void)
{
	EVP_MD *w = EVP_MD_fetch(NULL, "SHA256", "provider=wd");
	EVP_MD *d = EVP_MD_fetch(NULL, "SHA256", "provider=default");
	CHECK(w && d, "fetch SHA256");
	if (w == NULL || d == NULL)
		return;
	size_t len = wd_crypto_get_threshold();
	len = len < 64 ? 64 : len > 65536 ? 65536 : len;
	static unsigned char in[65536];
	fill(in, len);
	unsigned char a[32], b[32];
	unsigned int al = 0, bl = 0;
	int ok = EVP_Digest(in, len, b, &bl, d, NULL);
	EVP_MD_CTX *x = EVP_MD_CTX_new();
	ok = ok && EVP_DigestInit_ex2(x, w, NULL);
	/* Warm up (queues, caches), then measure. */
	for (int i = 0; ok && i < 50; i++)
		ok = EVP_DigestUpdate(x, in, len) && EVP_DigestFinal_ex(x, a, &al) && !memcmp(a, b, 32);
	struct mallinfo2 m0 = mallinfo2();
	for (int i = 0; ok && i < 1000; i++)
		ok = EVP_DigestUpdate(x, in, len) && EVP_DigestFinal_ex(x, a, &al) && !memcmp(a, b, 32);
	struct mallinfo2 m1 = mallinfo2();
	long grown = (long)m1.uordblks - (long)m0.uordblks;
	CHECK(ok, "1000 digests of %zu bytes, each after a final without an init", len);
	CHECK(grown < 64 * 1024, "and the heap grew by %ld bytes", grown);
	EVP_MD_CTX_free(x);
	EVP_MD_free(w);
	EVP_MD_free(d);
}

static void test_host_killed(pid_t host)
{
	EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=wd");
	EVP_CIPHER *d = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=default");
	static unsigned char in[1 << 20], a[(1 << 20) + 16], b[(1 << 20) + 16];
	unsigned char key[16], iv[16];
	fill(key, 16);
	fill(iv, 16);
	fill(in, sizeof in);
	struct wd_crypto_stats s0, s1;
	wd_crypto_get_stats(&s0);
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int l = 0, ok = EVP_EncryptInit_ex2(ctx, w, key, iv, NULL) && EVP_CIPHER_CTX_set_padding(ctx, 0);
	size_t half = sizeof in / 2;
	ok = ok && EVP_EncryptUpdate(ctx, a, &l, in, (int)half);
	kill(host, SIGKILL);
	usleep(100000);
	ok = ok && EVP_EncryptUpdate(ctx, a + half, &l, in + half, (int)half);
	EVP_CIPHER_CTX_free(ctx);
	size_t bl;
	run_cipher(d, 1, 0, key, iv, in, sizeof in, b, &bl, 0);
	CHECK(ok && !memcmp(a, b, sizeof in), "a CBC stream survives the host's death");
	wd_crypto_get_stats(&s1);
	CHECK(s1.cpu_host_gone > s0.cpu_host_gone || s1.cpu_no_queue > s0.cpu_no_queue,
	      "the fallback was counted");
	EVP_CIPHER_free(w);
	EVP_CIPHER_free(d);
}

/* Both providers' answers to one sequence of calls, by property query. */
static const char *const both[2] = {"provider=wd", "provider=default"};

/* CTR re-initialised without an IV (no key, or the same key again) goes on
 * from its running counter at the next block, as the default provider's
 * does; restarting from the IV reused its keystream. */
static void test_ctr_reinit_without_iv(void)
{
	unsigned char key[16], iv[16], in[64] = {0}, out[2][2][52];
	fill(key, sizeof key);
	fill(iv, sizeof iv);
	for (int again = 0; again < 2; again++)
		for (int k = 0; k < 2; k++) {
			EVP_CIPHER *c = EVP_CIPHER_fetch(NULL, "AES-128-CTR", both[k]);
			EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
			int l = 0;
			int ok = EVP_EncryptInit_ex(x, c, NULL, key, iv) &&
				 EVP_EncryptUpdate(x, out[again][k], &l, in, 20) &&
				 EVP_EncryptInit_ex(x, NULL, NULL, again ? key : NULL, NULL) &&
				 EVP_EncryptUpdate(x, out[again][k] + 20, &l, in, 32);
			CHECK(ok, "CTR re-init (%s)", both[k]);
			EVP_CIPHER_CTX_free(x);
			EVP_CIPHER_free(c);
		}
	CHECK(memcmp(out[0][0], out[0][1], 52) == 0, "CTR re-init without key or IV");
	CHECK(memcmp(out[1][0], out[1][1], 52) == 0, "CTR re-init with the same key, no IV");
}

/* Calls the provider cannot honour are refused, never answered with
 * success and nothing done: a CTR num moved, a GCM IV read before one
 * was set, a GCM IV generated from a fixed IV nobody set, a GCM tag read
 * before a message made one. */
static void test_refusals(void)
{
	unsigned char key[16], iv[16], in[64] = {0}, out[64], tag[16];
	fill(key, sizeof key);
	fill(iv, sizeof iv);
	EVP_CIPHER *ctr = EVP_CIPHER_fetch(NULL, "AES-128-CTR", "provider=wd");
	EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
	int l = 0;
	CHECK(EVP_EncryptInit_ex(x, ctr, NULL, key, iv) && EVP_EncryptUpdate(x, out, &l, in, 5),
	      "CTR");
	CHECK(EVP_CIPHER_CTX_set_num(x, 0) == 0, "moving a CTR stream in its block is refused");
	CHECK(EVP_CIPHER_CTX_set_num(x, 5) == 1, "a num that moves nowhere is taken");
	ERR_clear_error();
	EVP_CIPHER_CTX_free(x);
	EVP_CIPHER_free(ctr);

	EVP_CIPHER *gcm = EVP_CIPHER_fetch(NULL, "AES-128-GCM", "provider=wd");
	x = EVP_CIPHER_CTX_new();
	unsigned char uiv[16];
	CHECK(EVP_EncryptInit_ex(x, gcm, NULL, NULL, NULL) &&
		      EVP_CIPHER_CTX_get_updated_iv(x, uiv, sizeof uiv) <= 0 &&
		      EVP_CIPHER_CTX_get_original_iv(x, uiv, sizeof uiv) <= 0,
	      "no GCM IV to read before one is set");
	CHECK(EVP_EncryptInit_ex(x, NULL, NULL, key, iv), "GCM");
	unsigned char gen[12];
	memset(gen, 0xa5, sizeof gen);
	CHECK(EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_IV_GEN, sizeof gen, gen) <= 0,
	      "an IV generated without a fixed IV is refused");
	CHECK(EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, 16, tag) <= 0,
	      "no tag before the message's end");
	CHECK(EVP_EncryptUpdate(x, out, &l, in, 16) &&
		      EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, 16, tag) <= 0,
	      "no tag in the middle of a message");
	CHECK(EVP_EncryptFinal_ex(x, out, &l) && EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, 16, tag) == 1,
	      "the tag after the end");
	ERR_clear_error();
	EVP_CIPHER_CTX_free(x);
	EVP_CIPHER_free(gcm);

	EVP_CIPHER *xts = EVP_CIPHER_fetch(NULL, "AES-128-XTS", "provider=wd");
	CHECK(xts != NULL && (EVP_CIPHER_get_flags(xts) & EVP_CIPH_CUSTOM_IV),
	      "XTS takes its IV its own way, as the default provider says");
	EVP_CIPHER_free(xts);
}

/* A GCM message copied in its middle goes on in both copies (where it runs
 * here: one on the device cannot be copied, docs/provider.md), and a
 * message with more additional data than a device request carries is
 * sealed, both as the default provider does. */
static void test_gcm_copy_and_long_aad(void)
{
	const char *policy = getenv("WD_PROVIDER_POLICY");
	int here = policy == NULL || strcmp(policy, "offload") != 0;
	static unsigned char aad[100000], in[4096];
	unsigned char key[16], iv[12], out[2][3][sizeof in], tag[2][3][16];
	fill(key, sizeof key);
	fill(iv, sizeof iv);
	fill(aad, sizeof aad);
	fill(in, sizeof in);
	for (int k = 0; k < 2; k++) {
		EVP_CIPHER *c = EVP_CIPHER_fetch(NULL, "AES-128-GCM", both[k]);
		EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new(), *y = EVP_CIPHER_CTX_new();
		int l = 0;
		/* Small pieces below any threshold: the message runs here. */
		int ok = EVP_EncryptInit_ex(x, c, NULL, key, iv) &&
			 EVP_EncryptUpdate(x, NULL, &l, aad, 13) &&
			 EVP_EncryptUpdate(x, out[k][0], &l, in, 16);
		int copied = ok && EVP_CIPHER_CTX_copy(y, x);
		CHECK(copied || (k == 0 && !here), "GCM copied mid-message (%s)", both[k]);
		ERR_clear_error();
		if (!copied) { /* on the device: the rest as one copy would do */
			CHECK(EVP_EncryptUpdate(x, out[k][1], &l, in + 16, 48) &&
				      EVP_EncryptFinal_ex(x, out[k][1], &l) &&
				      EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, 16, tag[k][0]) == 1,
			      "GCM goes on (%s)", both[k]);
			memcpy(out[k][2], out[k][1], 48);
			memcpy(tag[k][1], tag[k][0], 16);
		}
		for (int j = 0; j < 2 && copied; j++) {
			EVP_CIPHER_CTX *z = j ? y : x;
			CHECK(EVP_EncryptUpdate(z, out[k][j + 1], &l, in + 16, 48) &&
				      EVP_EncryptFinal_ex(z, out[k][j + 1], &l) &&
				      EVP_CIPHER_CTX_ctrl(z, EVP_CTRL_AEAD_GET_TAG, 16, tag[k][j]) == 1,
			      "GCM copy %d goes on (%s)", j, both[k]);
		}
		EVP_CIPHER_CTX_reset(x);
		CHECK(EVP_EncryptInit_ex(x, c, NULL, key, iv) &&
			      EVP_EncryptUpdate(x, NULL, &l, aad, (int)sizeof aad) &&
			      EVP_EncryptUpdate(x, out[k][0], &l, in, (int)sizeof in) &&
			      EVP_EncryptFinal_ex(x, out[k][0], &l) &&
			      EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, 16, tag[k][2]) == 1,
		      "GCM with %zu bytes of additional data (%s)", sizeof aad, both[k]);
		EVP_CIPHER_CTX_free(x);
		EVP_CIPHER_CTX_free(y);
		EVP_CIPHER_free(c);
	}
	CHECK(memcmp(tag[0][0], tag[1][0], 16) == 0 && memcmp(tag[0][1], tag[1][1], 16) == 0 &&
		      memcmp(out[0][1], out[1][1], 48) == 0 && memcmp(out[0][2], out[1][2], 48) == 0,
	      "both copies of the message end as the default provider's");
	CHECK(memcmp(tag[0][2], tag[1][2], 16) == 0 && memcmp(out[0][0], out[1][0], sizeof in) == 0,
	      "long additional data as the default provider");
}

/* A thread that outlives the provider's last instance hands over the
 * counts of its small digests made under the next instance when it ends:
 * the thread-exit key is made again, and the thread registered with the
 * new one. Each instance lives in a library context of its own (freeing
 * it tears the provider down); the module stays mapped (-z nodelete).
 * Run alone (`reload`): no other instance may live. */
static pthread_barrier_t reload_barrier;
static OSSL_LIB_CTX *reload_ctx;

static void *digests_across_reload_fn(void *arg)
{
	(void)arg;
	unsigned char in[16] = {2}, out[64];
	unsigned int l = 0;
	long bad = 0;
	for (int round = 0; round < 2; round++) {
		EVP_MD *w = EVP_MD_fetch(reload_ctx, "SHA256", "provider=wd");
		for (int i = 0; i < 100; i++)
			bad += w == NULL || !EVP_Digest(in, sizeof in, out, &l, w, NULL);
		EVP_MD_free(w);
		pthread_barrier_wait(&reload_barrier); /* main makes the next instance */
		pthread_barrier_wait(&reload_barrier);
	}
	return (void *)bad;
}

static OSSL_PROVIDER *reload_wd;

static OSSL_LIB_CTX *reload_instance(const char *dir)
{
	OSSL_LIB_CTX *c = OSSL_LIB_CTX_new();
	if (c == NULL)
		return NULL;
	OSSL_PROVIDER_set_default_search_path(c, dir);
	if ((reload_wd = OSSL_PROVIDER_load(c, "wd")) == NULL) {
		OSSL_LIB_CTX_free(c);
		return NULL;
	}
	return c;
}

static void reload_end(OSSL_LIB_CTX *c)
{
	OSSL_PROVIDER_unload(reload_wd);
	OSSL_LIB_CTX_free(c);
}

static void test_reload_keeps_thread_counts(const char *dir)
{
	reload_ctx = reload_instance(dir);
	CHECK(reload_ctx != NULL, "load wd");
	if (reload_ctx == NULL)
		return;
	pthread_barrier_init(&reload_barrier, NULL, 2);
	pthread_t t;
	pthread_create(&t, NULL, digests_across_reload_fn, NULL);
	pthread_barrier_wait(&reload_barrier);
	reload_end(reload_ctx);
	reload_ctx = reload_instance(dir);
	struct wd_crypto_stats s0, s1;
	wd_crypto_get_stats(&s0);
	pthread_barrier_wait(&reload_barrier);
	pthread_barrier_wait(&reload_barrier); /* the second round is done */
	pthread_barrier_wait(&reload_barrier);
	void *bad = NULL;
	pthread_join(t, &bad);
	wd_crypto_get_stats(&s1);
	uint64_t counted = s1.cpu_requests - s0.cpu_requests + s1.offload_requests - s0.offload_requests;
	CHECK(reload_ctx != NULL && bad == NULL && counted >= 100,
	      "100 digests of a thread under a provider loaded again, %llu counted at its end",
	      (unsigned long long)counted);
	pthread_barrier_destroy(&reload_barrier);
	reload_end(reload_ctx);
}

static const char *dir_of_wd;

/* Small digests of a thread that outlives the provider's last instance:
 * their counts (kept in the thread until 4096 or its end) reach libwd
 * when that instance goes, or at the latest when the thread ends.
 * Run with no other instance (the reload run). */
static pthread_barrier_t solo_barrier;
static OSSL_LIB_CTX *solo_ctx;

static void *solo_digests_fn(void *arg)
{
	(void)arg;
	unsigned char in[16] = {1}, out[32];
	unsigned int l = 0;
	long bad = 0;
	EVP_MD *m = EVP_MD_fetch(solo_ctx, "SHA256", "provider=wd");
	for (int i = 0; i < 100; i++)
		bad += m == NULL || !EVP_Digest(in, sizeof in, out, &l, m, NULL);
	EVP_MD_free(m);
	pthread_barrier_wait(&solo_barrier); /* main ends the instance */
	pthread_barrier_wait(&solo_barrier);
	return (void *)bad;
}

static void solo_thread_counts(void)
{
	solo_ctx = OSSL_LIB_CTX_new();
	OSSL_PROVIDER_set_default_search_path(solo_ctx, dir_of_wd);
	OSSL_PROVIDER *p = OSSL_PROVIDER_load(solo_ctx, "wd");
	CHECK(p != NULL, "load wd alone");
	if (p == NULL)
		return;
	struct wd_crypto_stats s0, s1, s2;
	wd_crypto_get_stats(&s0);
	pthread_barrier_init(&solo_barrier, NULL, 2);
	pthread_t t;
	pthread_create(&t, NULL, solo_digests_fn, NULL);
	pthread_barrier_wait(&solo_barrier);
	OSSL_PROVIDER_unload(p);
	OSSL_LIB_CTX_free(solo_ctx); /* the last instance's teardown */
	wd_crypto_get_stats(&s1);
	pthread_barrier_wait(&solo_barrier);
	void *bad = NULL;
	pthread_join(t, &bad);
	wd_crypto_get_stats(&s2);
	uint64_t at_teardown = s1.cpu_requests - s0.cpu_requests + s1.offload_requests - s0.offload_requests;
	uint64_t at_end = s2.cpu_requests - s0.cpu_requests + s2.offload_requests - s0.offload_requests;
	CHECK(bad == NULL && at_end >= 100,
	      "100 digests of a thread alive at the last teardown: %llu counted then, %llu when it ended",
	      (unsigned long long)at_teardown, (unsigned long long)at_end);
	pthread_barrier_destroy(&solo_barrier);
}

/* Loading the provider again and again (each time into a new library
 * context, alone, so that each load is the only instance and its
 * teardown the last) leaves nothing behind: the inline path's own
 * library context, made at the first request, is freed with the last
 * instance (each load left one, with its default provider, about 6 KiB).
 * The heap is measured between the 10th and the 40th load.
 *
 * OpenSSL closes the module at each last teardown, but it stays mapped
 * (linked -z nodelete): another thread's exit destructor (its counts and
 * spare digest contexts) may still be running in it at that moment. */
static void test_reload_frees_the_cpu_path(const char *dir)
{
	unsigned char key[16] = {1}, iv[16] = {2}, in[64] = {3}, out[80], md[32];
	size_t at10 = 0;
	int ok = 1;
	for (int i = 0; i < 40 && ok; i++) {
		OSSL_LIB_CTX *c = reload_instance(dir);
		EVP_CIPHER *w = c != NULL ? EVP_CIPHER_fetch(c, "AES-128-CBC", "provider=wd") : NULL;
		EVP_MD *m = c != NULL ? EVP_MD_fetch(c, "SHA256", "provider=wd") : NULL;
		EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
		int l = 0;
		unsigned int ml = 0;
		ok = w != NULL && m != NULL && x != NULL && EVP_EncryptInit_ex2(x, w, key, iv, NULL) &&
		     EVP_EncryptUpdate(x, out, &l, in, sizeof in) && l == (int)sizeof in &&
		     EVP_Digest(in, sizeof in, md, &ml, m, NULL) && ml == 32;
		EVP_CIPHER_CTX_free(x);
		EVP_CIPHER_free(w);
		EVP_MD_free(m);
		if (c != NULL)
			reload_end(c);
		if (i == 9)
			at10 = mallinfo2().uordblks;
	}
	size_t at40 = mallinfo2().uordblks;
	CHECK(ok, "40 loads, each encrypting and digesting");
	CHECK(at40 < at10 + (64 << 10), "30 more loads: the heap grew by %zd bytes",
	      (ssize_t)(at40 - at10));
	char path[4096];
	snprintf(path, sizeof path, "%s/wd.so", dir);
	void *still = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	CHECK(still != NULL, "%s still mapped after its last instance", path);
	if (still != NULL)
		dlclose(still);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s <dir of wd.so>\n", argv[0]);
		return 2;
	}
	if (argc > 2 && strcmp(argv[2], "reload") == 0) {
		dir_of_wd = argv[1];
		test_reload_frees_the_cpu_path(argv[1]);
		solo_thread_counts();
		test_reload_keeps_thread_counts(argv[1]);
		printf("%d passed, %d failed (reload)\n", passed, failed);
		return failed != 0;
	}
	OSSL_PROVIDER_set_default_search_path(NULL, argv[1]);
	OSSL_PROVIDER *wd = OSSL_PROVIDER_load(NULL, "wd");
	OSSL_PROVIDER *def = OSSL_PROVIDER_load(NULL, "default");
	if (wd == NULL || def == NULL) {
		ERR_print_errors_fp(stderr);
		fprintf(stderr, "cannot load the providers\n");
		return 1;
	}
	const char *kill_pid = getenv("WD_TEST_KILL_PID");
	if (kill_pid != NULL) {
		test_host_killed((pid_t)atoi(kill_pid));
	} else {
		test_kats();
		test_ciphers_differential(12);
		test_gcm(10);
		test_gcm_evp_cipher();
		test_gcm_iv_spent();
		test_gcm_ivlen_change();
		test_tls_params_at_init();
		test_chain_state();
		test_digests(12);
		test_async();
		test_threads();
		test_fork();
		test_small_requests_counted();
		test_mixed_pieces();
		test_reused_answers_counted();
		test_small_digests();
		test_copied_digests_counted();
		test_digest_again_without_init();
		test_ctr_reinit_without_iv();
		test_refusals();
		test_gcm_copy_and_long_aad();
	}
	struct wd_crypto_stats s;
	wd_crypto_get_stats(&s);
	printf("%d passed, %d failed (offloaded %llu requests, %llu on the CPU)\n", passed, failed,
	       (unsigned long long)s.offload_requests, (unsigned long long)s.cpu_requests);
	OSSL_PROVIDER_unload(wd);
	OSSL_PROVIDER_unload(def);
	return failed != 0;
}
