-- The demo source: a small online shop as its operational database looks, mess included
-- (mixed-case e-mails, several phone formats, free-text countries, nulls, the same people in
-- customers and in the CRM export). `analytics` is the empty target schema.
create schema shop;
comment on schema shop is 'Demo online shop (operational database)';
create schema analytics;
comment on schema analytics is 'Target warehouse schema (empty until a schema sync)';

create table shop.products (
  product_id integer primary key,
  sku text not null unique,
  name text not null,
  category text not null,
  brand text,
  price numeric(10, 2) not null,
  currency char(3) not null default 'USD',
  is_active boolean not null default true,
  created_at timestamptz not null
);
comment on table shop.products is 'Product catalogue';
comment on column shop.products.sku is 'Stock keeping unit';
comment on column shop.products.price is 'List price in the product currency';

create table shop.customers (
  customer_id integer primary key,
  email text,
  first_name text,
  last_name text,
  phone text,
  country text,
  city text,
  postal_code text,
  birth_date date,
  gender text,
  marketing_opt_in boolean,
  signup_date date not null,
  created_at timestamptz not null,
  updated_at timestamptz
);
comment on table shop.customers is 'Web shop accounts; e-mail and phone as typed by the customer';
comment on column shop.customers.email is 'Login e-mail, not normalised';
comment on column shop.customers.country is 'Free text (codes and names mixed)';

create table shop.orders (
  order_id integer primary key,
  customer_id integer references shop.customers (customer_id),
  order_number text not null unique,
  status text not null,
  channel text not null,
  order_date timestamptz not null,
  shipping_country text,
  currency char(3) not null,
  subtotal numeric(12, 2) not null,
  shipping_cost numeric(10, 2) not null default 0,
  total_amount numeric(12, 2) not null,
  coupon_code text
);
comment on table shop.orders is 'Orders; guest checkouts have no customer_id';
create index orders_customer_idx on shop.orders (customer_id);

create table shop.order_items (
  order_item_id integer primary key,
  order_id integer not null references shop.orders (order_id),
  product_id integer not null references shop.products (product_id),
  quantity integer not null,
  unit_price numeric(10, 2) not null,
  discount_amount numeric(10, 2)
);
comment on table shop.order_items is 'Order lines';
create index order_items_order_idx on shop.order_items (order_id);

create table shop.web_events (
  event_id bigint primary key,
  session_id text not null,
  customer_id integer references shop.customers (customer_id),
  anonymous_id text not null,
  event_type text not null,
  page_url text,
  referrer text,
  utm_source text,
  utm_medium text,
  utm_campaign text,
  device_type text,
  product_id integer references shop.products (product_id),
  occurred_at timestamptz not null
);
comment on table shop.web_events is 'Clickstream; customer_id is known only after login';

create table shop.crm_contacts (
  contact_id text primary key,
  email text,
  full_name text,
  phone text,
  company text,
  job_title text,
  country text,
  lead_source text,
  lifecycle_stage text,
  created_date text,
  last_activity_at timestamptz,
  do_not_contact boolean
);
comment on table shop.crm_contacts is 'Export of the CRM: overlaps customers, dates as text';
comment on column shop.crm_contacts.created_date is 'As exported: several date formats';
